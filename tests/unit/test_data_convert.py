"""The converter's contract: index last, no index after a failure, resume verifies and skips."""
import json
import os

import h5py
import numpy as np
import pytest

from hpctrain.data_tools.cli import main as tools_main
from hpctrain.data_tools.sources import SourceError, from_arrays
from hpctrain.data_tools.writer import ConvertError, convert
from hpctrain.data import ShardSet, read_index


def arrays(n=50, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3, 4, 4), dtype=np.uint8), rng.integers(0, 5, n)


class Counting:
    """Wraps a split's ``read`` to count calls and fail on demand (a crash mid-conversion)."""

    def __init__(self, read, fail_at=None):
        self.read, self.fail_at, self.calls = read, fail_at, []

    def __call__(self, lo, hi):
        self.calls.append((lo, hi))
        if self.fail_at is not None and lo <= self.fail_at < hi:
            raise SourceError(f"src: sample {self.fail_at} is unreadable")
        return self.read(lo, hi)


def source_with(x, y, fail_at=None):
    src = from_arrays({"train": (x, y)}, [str(i) for i in range(5)], "src")
    counter = Counting(src.splits["train"].read, fail_at)
    src.splits["train"].read = counter
    return src, counter


def test_failed_conversion_leaves_no_index_and_resume_skips_finished(tmp_path):
    x, y = arrays()
    out = str(tmp_path / "ds")
    src, _ = source_with(x, y, fail_at=40)                  # shards of 10: the 5th fails
    with pytest.raises(ConvertError, match="sample 40 is unreadable"):
        convert(src, out, 5)
    assert not os.path.exists(os.path.join(out, "index.json"))
    assert sorted(f for f in os.listdir(out) if f.endswith(".h5")) == [f"train-0000{i}-of-00005.h5" for i in range(4)]
    assert not [f for f in os.listdir(out) if ".tmp" in f]     # the failed shard left no partial file

    src, counter = source_with(x, y)
    meta = convert(src, out, 5)
    assert meta["skipped_shards"] == 4 and counter.calls == [(40, 50)]
    np.testing.assert_array_equal(ShardSet(read_index(out), "train").read_range(0, 50)[0], x)


def test_resume_reconverts_a_changed_shard_and_new_options(tmp_path):
    x, y = arrays()
    out = str(tmp_path / "ds")
    convert(source_with(x, y)[0], out, 5)
    with open(os.path.join(out, "train-00002-of-00005.h5"), "r+b") as fh:
        fh.seek(-20, os.SEEK_END)
        fh.write(b"\0" * 20)                                   # damaged after it was finished
    src, counter = source_with(x, y)
    assert convert(src, out, 5)["skipped_shards"] == 4 and counter.calls == [(20, 30)]
    src, counter = source_with(x, y)
    assert convert(src, out, 5, tag="other options")["skipped_shards"] == 0 and len(counter.calls) == 5
    assert convert(source_with(x, y)[0], out, 5, tag="other options", resume=False)["skipped_shards"] == 0


def test_index_fields(tmp_path):
    x, y = arrays(23)
    meta = convert(from_arrays({"train": (x, y), "test": (x[:4], y[:4])}, list("abcde"), "s"), str(tmp_path), 3)
    idx = read_index(str(tmp_path))
    assert idx.sample_shape == (3, 4, 4) and idx.dtype == "uint8" and idx.encoding == "raw"
    assert idx.class_names == list("abcde") and idx.num_classes == 5
    assert [e["num_samples"] for e in idx.split("train")["shards"]] == [8, 8, 7]
    assert all(len(e["sha256"]) == 64 for e in idx.split("train")["shards"])
    flat = x.reshape(23, 3, -1).astype(np.float64)
    np.testing.assert_allclose(idx.normalize["mean"], flat.mean((0, 2)), rtol=1e-12)
    np.testing.assert_allclose(idx.normalize["std"], flat.std((0, 2)), rtol=1e-9)
    assert meta["splits"]["test"]["num_samples"] == 4


def test_chunks_bound_memory(tmp_path, monkeypatch):
    import hpctrain.data_tools.writer as w
    monkeypatch.setattr(w, "CHUNK_BYTES", 48 * 7)             # 7 samples of 48 bytes per read
    x, y = arrays(30)
    src, counter = source_with(x, y)
    convert(src, str(tmp_path), 2)
    assert counter.calls == [(0, 7), (7, 14), (14, 15), (15, 22), (22, 29), (29, 30)]
    np.testing.assert_array_equal(ShardSet(read_index(str(tmp_path)), "train").read_range(0, 30)[0], x)


def test_jpeg_encoding_of_arrays_decodes_close(tmp_path):
    x = np.repeat(np.repeat(np.arange(0, 250, 10, dtype=np.uint8)[None, None, :, None], 3, 1), 25, 3)
    x = np.repeat(x, 6, 0)                                     # smooth gradients: JPEG is near-lossless
    src = from_arrays({"train": (x, np.zeros(6, np.int64))}, ["only"], "s", encode="jpeg")
    convert(src, str(tmp_path), 2)
    from hpctrain.data.images import decode_batch
    blobs, _ = ShardSet(read_index(str(tmp_path)), "train").read_range(0, 6)
    assert isinstance(blobs[0], np.ndarray) and blobs[0][:2].tolist() == [0xFF, 0xD8]   # JPEG SOI marker
    assert np.abs(decode_batch(blobs, (3, 25, 25)).astype(int) - x).max() <= 4


def test_cli_verify_and_inspect(tmp_path, capsys):
    x, y = arrays(20)
    np.savez(tmp_path / "a.npz", x=x, y=y)
    out = str(tmp_path / "ds")
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "a.npz"), "--out", out, "--shards", "2",
                       "--no-progress"]) == 0
    assert tools_main(["verify", out]) == 0 and "OK" in capsys.readouterr().out
    png = tmp_path / "grid.png"
    assert tools_main(["inspect", out, "--grid", str(png), "-n", "9"]) == 0
    text = capsys.readouterr().out
    assert "raw uint8 samples of shape (3, 4, 4)" in text and "train: 16 samples in 2 shard(s)" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path = os.path.join(out, "train-00001-of-00002.h5")
    with h5py.File(path, "r") as fh:       # the grid passes through x's start; the file is under one block
        x0, size = fh["x"].id.get_offset(), os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        fh.write(b"\x01")
    assert tools_main(["verify", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"data_tools: error: {path}: checksum mismatch in block 1 "
                                               f"(bytes {x0}..{size};")


def test_resume_adds_block_digests_to_shards_made_before_index_v3(tmp_path):
    """Records without ``blocks`` (a pre-v3 conversion) or of another block size: the rerun keeps
    the shard files, reads each once and records its blocks, as a fresh conversion would."""
    x, y = arrays()
    out = str(tmp_path / "ds")
    convert(source_with(x, y)[0], out, 5, block_bytes=512)
    fresh = read_index(out).split("train")["shards"]
    records = os.path.join(out, ".convert")
    for name in os.listdir(records):
        path = os.path.join(records, name)
        rec = json.load(open(path))
        del rec["entry"]["blocks"]
        json.dump(rec, open(path, "w"))
    stamps = {f: os.stat(os.path.join(out, f)).st_mtime_ns for f in os.listdir(out) if f.endswith(".h5")}
    src, counter = source_with(x, y)
    assert convert(src, out, 5, block_bytes=512)["skipped_shards"] == 5 and counter.calls == []
    assert read_index(out).split("train")["shards"] == fresh
    assert stamps == {f: os.stat(os.path.join(out, f)).st_mtime_ns for f in stamps}
    src, counter = source_with(x, y)
    assert convert(src, out, 5, block_bytes=1024)["skipped_shards"] == 5 and counter.calls == []
    # 16 rows of 48 bytes: the power-of-two number of rows nearest 1 KiB (512: 8 rows)
    assert {e["blocks"]["bytes"] for e in fresh} == {384}
    assert all(e["blocks"]["bytes"] == 768 for e in read_index(out).split("train")["shards"])
