"""Corrupt data never trains: one changed byte anywhere in a shard is a one-line ShardError naming it.

Serial side (no communicator: each shard hashed by the process when it first opens it, in the
loader's thread when the loader reads); the collective check over ranks, and ``mpio``, are in
``tests/mpi/test_data_integrity.py``; the CLI job in ``tests/integration/test_corrupt_data.py``.
"""
import json
import os
import shutil

import h5py
import numpy as np
import pytest

from hpctrain.data import ShardError, ShardLoader, ShardSet, read_index
from tests.integration.inprocess import run_data_tools
from tests.shard_files import convert_digits, flip

SHARD = "train-00002-of-00004.h5"


@pytest.fixture(scope="module")
def digits_src(tmp_path_factory):
    return convert_digits(tmp_path_factory.mktemp("integrity") / "digits")


@pytest.fixture
def digits(digits_src, tmp_path):
    d = tmp_path / "digits"
    shutil.copytree(digits_src, d)
    return str(d)


def positions(path: str) -> dict:
    """Byte offsets to flip: inside x's samples, inside y's labels, in HDF5 metadata, last byte."""
    with h5py.File(path, "r") as fh:
        x_off, y_off = fh["x"].id.get_offset(), fh["y"].id.get_offset()
    return {"x sample": x_off + 64 * 7 + 30, "y label": y_off + 8 * 11, "superblock": 24,
            "object header": 800, "between headers and data": x_off - 16,
            "last byte": os.path.getsize(path) - 1}


WHERE = ["x sample", "y label", "superblock", "object header", "between headers and data", "last byte"]


@pytest.mark.parametrize("where", WHERE)
def test_flipped_byte_stops_the_read_that_touches_its_shard(digits, where):
    path = os.path.join(digits, SHARD)
    flip(path, positions(path)[where])
    s = ShardSet(read_index(digits), "train")
    start, stop = int(s.starts[2]), int(s.starts[3])
    s.read_range(0, start)                               # shards 0 and 1 are intact: read fine
    with pytest.raises(ShardError) as err:
        s.read_range(start - 5, start + 5)               # the first read that touches shard 2
    msg = str(err.value)
    assert msg.startswith(path + ": checksum mismatch") and "\n" not in msg
    with pytest.raises(ShardError, match="checksum mismatch"):
        s.read_range(stop - 3, stop)                     # still refused: never trusted after a mismatch
    s.close()


@pytest.mark.parametrize("where", ["x sample", "y label", "object header"])
def test_flipped_byte_reaches_the_training_loop_from_the_loader_thread(digits, where):
    path = os.path.join(digits, SHARD)
    flip(path, positions(path)[where])
    s = ShardSet(read_index(digits), "train")
    ld = ShardLoader(s, rank=0, size=1, batch_size=16, block_size=8, shuffle_window=64, prefetch=2)
    with pytest.raises(ShardError, match=f"{SHARD}: checksum mismatch"):
        for _ in ld.epoch(0):
            pass
    ld.close()
    s.close()


def test_without_the_check_the_flip_trains_silently(digits):
    """What the check prevents: with verify off, a flipped sample byte is read as data."""
    path = os.path.join(digits, SHARD)
    clean = ShardSet(read_index(digits), "train")
    want, _ = clean.read_range(0, clean.num_samples)
    clean.close()
    flip(path, positions(path)["x sample"])
    s = ShardSet(read_index(digits), "train", verify="off")
    got, _ = s.read_range(0, s.num_samples)
    assert (got != want).sum() == 1 and "not checked" in s.describe()
    s.close()


def test_intact_data_reads_identically_with_and_without_the_check(digits):
    idx = read_index(digits)
    on, off = ShardSet(idx, "train"), ShardSet(idx, "train", verify="off")
    kw = dict(rank=0, size=1, batch_size=16, block_size=8, shuffle_window=64, prefetch=2)
    a, b = ShardLoader(on, **kw), ShardLoader(off, **kw)
    for (x1, y1), (x2, y2) in zip(a.epoch(0), b.epoch(0), strict=True):
        assert np.array_equal(x1.numpy(), x2.numpy()) and np.array_equal(y1.numpy(), y2.numpy())
    assert on.checks.verified == set(range(4)) and on.checks.verify_s > 0 and off.checks.verify_s == 0
    assert "metadata blocks checked at open, data blocks as first read" in on.describe()
    for part in (a, b, on, off):
        part.close()


def test_verify_mode_is_checked(digits):
    with pytest.raises(ValueError, match="expected one of shared | node | off"):
        ShardSet(read_index(digits), "train", verify="maybe")


def _edit_index(d: str, edit) -> str:
    path = os.path.join(d, "index.json")
    meta = json.load(open(path))
    edit(meta)
    json.dump(meta, open(path, "w"))
    return path


@pytest.mark.parametrize("name", ["/etc/passwd", "../outside.h5", "sub/../../outside.h5", "..", "", ".",
                                  "a/..\\..\\b.h5", 7])
def test_index_file_entries_stay_inside_the_directory(digits, name):
    def edit(meta):
        meta["splits"]["train"]["shards"][1]["file"] = name
    path = _edit_index(digits, edit)
    with pytest.raises(ShardError) as err:
        read_index(digits)
    msg = str(err.value)
    assert msg.startswith(f"{path}: split 'train' shard 1: field 'file' is {name!r}") and "inside" in msg


def test_symlinked_shard_inside_the_directory_is_followed(digits, tmp_path):
    """Lexical rule: the index cannot point outside, but the directory's owner may symlink a file in."""
    elsewhere = tmp_path / "elsewhere.h5"
    shutil.move(os.path.join(digits, SHARD), elsewhere)
    os.symlink(elsewhere, os.path.join(digits, SHARD))
    s = ShardSet(read_index(digits), "train")
    s.read_range(0, s.num_samples)
    s.close()


@pytest.mark.parametrize("field,want", [("sha256", "missing field 'sha256'"), ("num_samples", "missing field"),
                                        ("shards", "split 'train': missing field 'shards'")])
def test_index_without_fields_is_one_line(digits, field, want):
    def edit(meta):
        target = meta["splits"]["train"] if field == "shards" else meta["splits"]["train"]["shards"][0]
        del target[field]
    _edit_index(digits, edit)
    with pytest.raises(ShardError, match=want):
        read_index(digits)


def test_bad_sha256_field(digits):
    _edit_index(digits, lambda m: m["splits"]["test"]["shards"][3].update(sha256="abc"))
    with pytest.raises(ShardError, match=r"split 'test' shard 3: field 'sha256' is 'abc'"):
        read_index(digits)


def data_tools(capsys, *args):
    """The ``hpctrain.data_tools`` command in process (tests/integration/inprocess.py)."""
    r = run_data_tools(capsys, *args)
    return r.returncode, r.stdout, r.stderr


def assert_one_line_error(rc, out, err, *needles):
    assert rc == 2, (out, err)
    assert out == "" and err.count("\n") == 1 and err.startswith("data_tools: error: "), err
    assert "Traceback" not in err and all(n in err for n in needles), err


def test_cli_verify_and_inspect_refuse_a_flipped_byte(digits, capsys):
    path = os.path.join(digits, SHARD)
    flip(path, positions(path)["x sample"])
    for cmd in ("verify", "inspect"):
        assert_one_line_error(*data_tools(capsys, cmd, digits), SHARD, "checksum mismatch")
    rc, out, _ = data_tools(capsys, "inspect", "--no-verify", digits)
    assert rc == 0 and "train: 1438 samples" in out


def test_grid_checks_the_shards_it_reads(digits, tmp_path):
    from hpctrain.data_tools.inspection import grid
    png = str(tmp_path / "g.png")
    assert "4 train samples" in grid(digits, png, n=4)
    path = os.path.join(digits, "train-00000-of-00004.h5")
    flip(path, positions(path)["x sample"])
    with pytest.raises(ShardError, match="train-00000-of-00004.h5: checksum mismatch"):
        grid(digits, png, n=4)
    flip(os.path.join(digits, "train-00003-of-00004.h5"), 100)          # a shard the grid does not read
    flip(path, positions(path)["x sample"])                             # restored
    assert "4 train samples" in grid(digits, png, n=4)


@pytest.mark.parametrize("field", ["sha256", "shards"])
def test_cli_verify_on_an_index_without_a_field(digits, field, capsys):
    def edit(meta):
        target = meta["splits"]["train"] if field == "shards" else meta["splits"]["train"]["shards"][0]
        del target[field]
    _edit_index(digits, edit)
    assert_one_line_error(*data_tools(capsys, "verify", digits), "index.json", repr(field))


@pytest.mark.parametrize("no_verify", [False, True])
def test_cli_inspect_with_a_missing_shard(digits, no_verify, capsys):
    os.remove(os.path.join(digits, SHARD))
    args = ["inspect", digits] + (["--no-verify"] if no_verify else [])
    assert_one_line_error(*data_tools(capsys, *args), f"{SHARD}: shard file missing")


def test_cli_verify_and_inspect_pass_on_intact_data(digits, capsys):
    rc, out, err = data_tools(capsys, "verify", digits)
    assert rc == 0 and "OK" in out, err
    rc, out, err = data_tools(capsys, "inspect", digits)
    assert rc == 0 and "train: 1438 samples in 4 shard(s)" in out, err
