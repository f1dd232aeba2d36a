"""Untrusted input to ``data_tools convert``: one error line naming the file, nothing written, no
traceback, no hang, no allocation sized by the input."""
import os
import zipfile

import numpy as np
import pytest
from PIL import Image

import hpctrain.data_tools.samplechecks as samplechecks
import hpctrain.data_tools.sources as sources
from hpctrain.data_tools.cli import main as tools_main
from hpctrain.data_tools.readers import SOURCES
from hpctrain.data_tools.sources import MAX_CLASSES, SourceError, from_arrays
from hpctrain.data_tools.writer import ConvertError, convert
from hpctrain.data import read_index


def refused(capsys, argv, *needles):
    """Run the CLI; expect status 2, one stderr line holding every needle, and no output directory."""
    out = argv[argv.index("--out") + 1]
    assert tools_main(["convert", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for needle in needles:
        assert needle in err[0], (needle, err[0])
    assert not os.path.exists(os.path.join(out, "index.json"))
    return err[0]


def image_tree(root, n=1, name="0.png"):
    os.makedirs(root / "a", exist_ok=True)
    for k in range(n):
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(root / "a" / f"{k}{name}")


# ---------------------------------------------------------------- labels (1)
def test_huge_label_is_refused_before_any_class_name_is_built(tmp_path, capsys):
    np.savez(tmp_path / "big.npz", x=np.zeros((3, 2), np.float32), y=np.array([0, 10**9, 1]))
    out = str(tmp_path / "o")
    refused(capsys, ["--from", "npz", str(tmp_path / "big.npz"), "--out", out],
            "big.npz: array 'y': sample 1 has label 1000000000", f"at most {MAX_CLASSES:,} classes")
    assert not os.path.exists(out)                      # refused while reading the source


@pytest.mark.parametrize("y, needle", [
    (np.array([0, 2, -3]), "array 'y': sample 2 has a negative label (-3)"),
    (np.array([0.0, 1.0, 1.0]), "array 'y': labels must be a 1-D integer array, got float64"),
    (np.array([True, False, True]), "array 'y': labels must be a 1-D integer array, got bool"),
    (np.array([[0], [1], [1]]), "array 'y': labels must be a 1-D integer array, got int64 (3, 1)"),
    (np.int64(1), "array 'y': labels must be a 1-D integer array, got int64 ()"),
])
def test_bad_labels_are_one_line(tmp_path, capsys, y, needle):
    np.savez(tmp_path / "l.npz", x=np.zeros((3, 2), np.float32), y=y)
    refused(capsys, ["--from", "npz", str(tmp_path / "l.npz"), "--out", str(tmp_path / "o")], "l.npz: " + needle)


def test_largest_allowed_label_converts(tmp_path):
    np.savez(tmp_path / "ok.npz", x=np.zeros((2, 1), np.float32), y=np.array([0, MAX_CLASSES - 1]))
    src = SOURCES["npz"](str(tmp_path / "ok.npz"), test_fraction=0.0)
    assert len(src.class_names) == MAX_CLASSES


# ---------------------------------------------------------------- sample size (2)
def test_size_over_the_sample_limit_is_refused_before_reading(tmp_path, capsys):
    out = str(tmp_path / "o")
    refused(capsys, ["--from", "digits", "--size", "100000", "100000", "--out", out],
            "--size 100000 100000: one sample is uint8 (3, 100000, 100000)", "over the limit of 256 MiB")
    assert not os.path.exists(out)


def test_writer_refuses_an_oversized_sample_before_writing(tmp_path, monkeypatch):
    image_tree(tmp_path / "src", 2)                     # no --size: 4×4×3 = 48 bytes per sample
    monkeypatch.setattr(samplechecks, "MAX_SAMPLE_BYTES", 40)
    src = SOURCES["imagefolder"](str(tmp_path / "src"), test_fraction=0.0)
    with pytest.raises(ConvertError, match=r"src: one sample is uint8 \(3, 4, 4\) = 0 MiB, over the limit"):
        convert(src, str(tmp_path / "o"))
    assert not os.path.exists(tmp_path / "o")


def npz_with_header_only(path, shape, dtype="<u1"):
    """An .npz whose ``x`` declares ``shape`` but holds no data: only a header check can refuse it cheaply."""
    import io
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": dtype, "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", head.getvalue())
        buf = io.BytesIO()
        np.save(buf, np.zeros(shape[0], np.int64))
        z.writestr("y.npy", buf.getvalue())


def test_npz_headers_are_checked_before_data_is_read(tmp_path, monkeypatch):
    npz_with_header_only(tmp_path / "huge.npz", (2, 3, 100000, 100000))
    with pytest.raises(SourceError, match=r"huge.npz: array 'x': one sample is uint8 \(3, 100000, 100000\)"):
        SOURCES["npz"](str(tmp_path / "huge.npz"))
    np.savez(tmp_path / "small.npz", x=np.zeros((4, 2), np.float32), y=np.zeros(4, np.int64))
    monkeypatch.setattr(sources, "_memory_bytes", lambda: 16)     # a zip bomb: more than memory declared
    with pytest.raises(SourceError, match=r"small.npz: arrays declare .* GiB, more than this machine's memory"):
        SOURCES["npz"](str(tmp_path / "small.npz"))


# ---------------------------------------------------------------- broken npz (3, 4)
def test_truncated_npz_is_one_line(tmp_path, capsys):
    np.savez_compressed(tmp_path / "good.npz", x=np.zeros((20, 3), np.float32), y=np.arange(20) % 2)
    data = (tmp_path / "good.npz").read_bytes()
    (tmp_path / "t.npz").write_bytes(data[:len(data) // 2])
    refused(capsys, ["--from", "npz", str(tmp_path / "t.npz"), "--out", str(tmp_path / "o")],
            "t.npz: not a readable .npz (BadZipFile")
    for k in range(0, len(data), 7):                    # any cut: a SourceError, never another exception
        (tmp_path / "t.npz").write_bytes(data[:k])
        with pytest.raises(SourceError, match="t.npz"):
            SOURCES["npz"](str(tmp_path / "t.npz"))


def test_npz_that_is_an_npy_or_a_pickle_is_one_line(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros(3))
    os.rename(tmp_path / "a.npy", tmp_path / "a.npz")
    refused(capsys, ["--from", "npz", str(tmp_path / "a.npz"), "--out", str(tmp_path / "o")],
            "a.npz: not a readable .npz")
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}, None], dtype=object), y=np.zeros(2, np.int64))
    refused(capsys, ["--from", "npz", str(tmp_path / "obj.npz"), "--out", str(tmp_path / "o")],
            "obj.npz: array 'x' holds Python objects")


def test_zero_d_x_is_one_line(tmp_path, capsys):
    np.savez(tmp_path / "z.npz", x=np.float32(1.0), y=np.array([0]))
    refused(capsys, ["--from", "npz", str(tmp_path / "z.npz"), "--out", str(tmp_path / "o")],
            "z.npz: array 'x' is 0-d float32")


# ---------------------------------------------------------------- --test-fraction (5)
def test_test_fraction_that_leaves_no_training_sample(tmp_path, capsys):
    image_tree(tmp_path / "one")
    refused(capsys, ["--from", "imagefolder", str(tmp_path / "one"), "--test-fraction", "0.6", "--out",
                     str(tmp_path / "o")], "one: 1 sample(s) with --test-fraction 0.6 leave no training sample")
    np.savez(tmp_path / "one.npz", x=np.zeros((1, 2), np.float32), y=np.array([0]))
    with pytest.raises(SourceError, match="one.npz: 1 sample"):
        SOURCES["npz"](str(tmp_path / "one.npz"), test_fraction=0.6)


@pytest.mark.parametrize("fraction", ["1", "1.5", "-0.1", "nan"])
def test_test_fraction_out_of_range(tmp_path, capsys, fraction):
    refused(capsys, ["--from", "digits", "--test-fraction", fraction, "--out", str(tmp_path / "o")],
            f"--test-fraction {float(fraction)}: must be in [0, 1)")
    with pytest.raises(SourceError, match=r"must be in \[0, 1\)"):
        SOURCES["digits"](None, test_fraction=float(fraction))


# ---------------------------------------------------------------- non-regular files (6)
@pytest.mark.timeout(30)
def test_fifo_in_an_image_folder_is_refused_without_opening_it(tmp_path, capsys):
    image_tree(tmp_path / "src", 2)
    os.mkfifo(tmp_path / "src" / "a" / "x.png")         # opening it would block until a writer comes
    refused(capsys, ["--from", "imagefolder", str(tmp_path / "src"), "--out", str(tmp_path / "o")],
            "src/a/x.png: a FIFO, not a regular image file")
    os.remove(tmp_path / "src" / "a" / "x.png")
    os.mkdir(tmp_path / "src" / "a" / "d.png")
    with pytest.raises(SourceError, match="a/d.png: a folder, not a regular image file"):
        SOURCES["imagefolder"](str(tmp_path / "src"))


@pytest.mark.timeout(30)
def test_file_replaced_by_a_fifo_after_listing_is_refused(tmp_path):
    image_tree(tmp_path / "src", 2)
    src = SOURCES["imagefolder"](str(tmp_path / "src"), test_fraction=0.0, size=(4, 4))
    os.remove(tmp_path / "src" / "a" / "10.png")
    os.mkfifo(tmp_path / "src" / "a" / "10.png")
    with pytest.raises(SourceError, match="a/10.png: a FIFO"):
        src.splits["train"].read(0, 2)


def test_symlink_to_a_regular_image_is_allowed(tmp_path):
    image_tree(tmp_path / "src", 1)
    os.symlink(tmp_path / "src" / "a" / "00.png", tmp_path / "src" / "a" / "link.png")
    meta = convert(SOURCES["imagefolder"](str(tmp_path / "src"), test_fraction=0.0), str(tmp_path / "o"))
    assert meta["splits"]["train"]["num_samples"] == 2
    os.symlink(tmp_path / "nowhere.png", tmp_path / "src" / "a" / "dangling.png")
    with pytest.raises(SourceError, match="a/dangling.png: cannot stat"):
        SOURCES["imagefolder"](str(tmp_path / "src"))


# ---------------------------------------------------------------- sample values (7)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_samples_are_refused_unless_allowed(tmp_path, capsys, bad):
    x = np.ones((10, 2), np.float32)
    x[6, 1] = bad
    np.savez(tmp_path / "n.npz", x=x, y=np.arange(10) % 2)
    args = ["--from", "npz", str(tmp_path / "n.npz"), "--out", str(tmp_path / "o")]
    refused(capsys, args, "n.npz: array 'x': sample 6 has NaN or inf values", "--allow-nonfinite")
    assert tools_main(["convert", "--no-progress", "--allow-nonfinite", *args]) == 0
    assert read_index(str(tmp_path / "o")).dtype == "float32"


@pytest.mark.parametrize("x, needle", [
    (np.ones((4, 2), np.complex64), "samples are complex64"),
    (np.ones((4, 2), bool), "samples are bool; need an integer or real float dtype (store x.astype(np.uint8)"),
    (np.array([["a", "b"]] * 4), "samples are <U1"),
])
def test_non_numeric_samples_are_always_refused(tmp_path, capsys, x, needle):
    np.savez(tmp_path / "c.npz", x=x, y=np.zeros(4, np.int64))
    refused(capsys, ["--from", "npz", str(tmp_path / "c.npz"), "--allow-nonfinite", "--out", str(tmp_path / "o")],
            "c.npz: array 'x': " + needle)


def test_from_arrays_checks_samples_for_every_source():
    with pytest.raises(SourceError, match="s: split train: samples are complex128"):
        from_arrays({"train": (np.ones((2, 2), complex), np.zeros(2, np.int64))}, ["a"], "s")
    x = np.ones((2, 2))
    x[1, 0] = np.nan
    with pytest.raises(SourceError, match="s: split test: sample 1 has NaN"):
        from_arrays({"train": (np.ones((2, 2)), np.zeros(2, np.int64)), "test": (x, np.zeros(2, np.int64))}, ["a"], "s")
