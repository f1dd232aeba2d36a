"""Per-block digests (index v4: XXH3-128; v3: SHA-256): a changed byte in a data block is refused by the read that first
touches it, naming the file and the block; metadata blocks at open; v2 indexes checked whole.

The digits are converted with 1 KiB blocks (``--block-kib 1``) so that each shard has data blocks
(the default 1 MiB block would cover a whole digits shard, checked at open). The collective
check over ranks is in ``tests/mpi/test_data_integrity.py``; the CLI job in
``tests/integration/test_corrupt_data.py``.
"""
import hashlib
import json
import os
import shutil

import h5py
import numpy as np
import pytest
import xxhash

from hpctrain.data import ShardError, ShardLoader, ShardSet, read_index
from tests.shard_files import convert_digits, flip

SHARD = "train-00002-of-00004.h5"
KIB = 1024


@pytest.fixture(scope="module")
def blocks_src(tmp_path_factory):
    return convert_digits(tmp_path_factory.mktemp("blocks") / "digits", block_kib=1)


@pytest.fixture
def digits(blocks_src, tmp_path):
    d = tmp_path / "digits"
    shutil.copytree(blocks_src, d)
    return str(d)


def x_byte(path: str, sample: int) -> int:
    with h5py.File(path, "r") as fh:
        return fh["x"].id.get_offset() + 64 * sample + 5


def entry(d: str, name: str = SHARD) -> dict:
    return next(e for e in read_index(d).split("train")["shards"] if e["file"] == name)


@pytest.fixture(scope="module")
def sha256_src(tmp_path_factory):
    """The digits with SHA-256 blocks: a version 3 index, as hpctrain before v4 wrote and reads them."""
    d = convert_digits(tmp_path_factory.mktemp("sha256") / "digits", block_kib=1, block_digest="sha256")
    assert json.load(open(os.path.join(d, "index.json")))["version"] == 3
    return d


def test_index_blocks_are_the_files_xxh3_128_per_kib(blocks_src):
    """Independent: xxhash's one-shot XXH3-128 over the file's own 1 KiB slices; data ranges inside x and y."""
    path = os.path.join(blocks_src, SHARD)
    e, raw = entry(blocks_src), open(path, "rb").read()
    b = e["blocks"]
    assert read_index(blocks_src).splits and json.load(open(os.path.join(blocks_src, "index.json")))["version"] == 4
    assert b["bytes"] == KIB and b["file_bytes"] == len(raw) and "sha256" not in b
    assert b["xxh3_128"] == [xxhash.xxh3_128_hexdigest(raw[k:k + KIB]) for k in range(0, len(raw), KIB)]
    assert e["sha256"] == hashlib.sha256(raw).hexdigest()               # the whole file stays SHA-256
    with h5py.File(path, "r") as fh:
        spans = [(fh[k].id.get_offset(), fh[k].id.get_offset() + fh[k].id.get_storage_size()) for k in "xy"]
    data = [k for a, c in b["data"] for k in range(a, c)]
    assert len(data) > 10 and all(any(s <= k * KIB and (k + 1) * KIB <= e for s, e in spans) for k in data)


def test_flipped_data_byte_is_refused_by_the_read_that_touches_its_block(digits):
    path = os.path.join(digits, SHARD)
    pos = x_byte(path, 200)
    k = pos // KIB
    assert any(a <= k < c for a, c in entry(digits)["blocks"]["data"])     # checked on read, not at open
    flip(path, pos)
    s = ShardSet(read_index(digits), "train")
    start = int(s.starts[2])
    s.read_range(0, start + 100)                 # opens shard 2 (metadata fine), reads other blocks
    with pytest.raises(ShardError) as err:
        s.read_range(start + 150, start + 250)
    msg = str(err.value)
    assert msg == f"{path}: checksum mismatch in block {k} (bytes {k * KIB}..{(k + 1) * KIB}; file changed or corrupted)"
    with pytest.raises(ShardError, match=f"block {k} "):
        s.read_range(start + 199, start + 201)   # still refused: never trusted after a mismatch
    s.close()


def test_flipped_metadata_byte_is_refused_at_open(digits):
    path = os.path.join(digits, SHARD)
    flip(path, 800)                                                   # an object header
    s = ShardSet(read_index(digits), "train")
    s.read_range(0, int(s.starts[2]))
    with pytest.raises(ShardError, match=f"{path}: checksum mismatch in block 0 "):
        s.read_range(int(s.starts[2]), int(s.starts[2]) + 1)
    s.close()


def test_clean_data_gives_the_same_batches_and_every_block_is_checked_once(blocks_src):
    """Same batches as an unchecked set; h5py's own read of every shard as the reference."""
    idx = read_index(blocks_src)
    on, off = ShardSet(idx, "train"), ShardSet(idx, "train", verify="off")
    kw = dict(rank=0, size=1, batch_size=16, block_size=8, shuffle_window=64, prefetch=2)
    a, b = ShardLoader(on, **kw), ShardLoader(off, **kw)
    for epoch in (0, 1):
        for (x1, y1), (x2, y2) in zip(a.epoch(epoch), b.epoch(epoch), strict=True):
            assert np.array_equal(x1.numpy(), x2.numpy()) and np.array_equal(y1.numpy(), y2.numpy())
    assert all(c.done.all() for c in on.checks.blocks.values()) and len(on.checks.blocks) == 4
    x, y = on.read_range(0, on.num_samples)
    want = [h5py.File(on.path(i), "r") for i in range(4)]
    np.testing.assert_array_equal(x, np.concatenate([f["x"][:] for f in want]))
    np.testing.assert_array_equal(y, np.concatenate([f["y"][:] for f in want]))
    for f in want:
        f.close()
    assert "data blocks as first read" in on.describe()
    for part in (a, b, on, off):
        part.close()


def test_loader_never_yields_a_batch_of_the_bad_block(blocks_src, digits):
    """The error comes in place of the batch: every batch before it equals the clean run's."""
    path = os.path.join(digits, SHARD)
    flip(path, x_byte(path, 120))
    kw = dict(rank=0, size=1, batch_size=16, block_size=8, shuffle_window=64, prefetch=2)
    clean = ShardLoader(ShardSet(read_index(blocks_src), "train"), **kw)
    bad = ShardLoader(ShardSet(read_index(digits), "train"), **kw)
    got = 0
    with pytest.raises(ShardError, match=f"{SHARD}: checksum mismatch in block"):
        for (x1, _), (x2, _) in zip(bad.epoch(0), clean.epoch(0)):
            assert np.array_equal(x1.numpy(), x2.numpy())
            got += 1
    assert got < bad.steps
    for ld in (bad, clean):
        ld.close()
        ld.shards.close()


@pytest.mark.skipif("not __import__('hpctrain.data.hdf5').data.hdf5.mpio_status(__import__('mpi4py.MPI').MPI.COMM_SELF)[0]",
                    reason="h5py without MPI")
def test_parallel_hdf5_reads_are_checked_too(blocks_src, digits):
    """driver mpio (over one rank here): HDF5 reads the rows; their blocks are hashed from the buffer."""
    from mpi4py import MPI
    idx = read_index(blocks_src)
    s, plain = ShardSet(idx, "train", comm=MPI.COMM_SELF, driver="mpio"), ShardSet(idx, "train", verify="off")
    for got, want in zip(s.read_range(3, s.num_samples - 2), plain.read_range(3, s.num_samples - 2)):
        np.testing.assert_array_equal(got, want)
    assert s.driver == "mpio" and all(c.done[c.data].all() for c in s.checks.blocks.values())
    s.close()
    path = os.path.join(digits, SHARD)
    pos = x_byte(path, 200)
    flip(path, pos)
    s = ShardSet(read_index(digits), "train", comm=MPI.COMM_SELF, driver="mpio")
    start = int(s.starts[2])
    s.read_range(0, start + 100)
    with pytest.raises(ShardError, match=f"^{path}: checksum mismatch in block {pos // KIB} "):
        s.read_range(start + 150, start + 250)
    s.close()


def test_v3_index_with_sha256_blocks_still_refuses_a_flipped_data_byte(sha256_src, tmp_path):
    """Datasets converted before index v4 keep their per-block check: SHA-256, as read."""
    d = shutil.copytree(sha256_src, tmp_path / "digits")
    path = os.path.join(d, SHARD)
    e, raw = entry(d), open(path, "rb").read()
    assert e["blocks"]["sha256"] == [hashlib.sha256(raw[k:k + KIB]).hexdigest() for k in range(0, len(raw), KIB)]
    pos = x_byte(path, 200)
    flip(path, pos)
    s = ShardSet(read_index(d), "train")
    assert "SHA-256 of 1 KiB blocks" in s.describe()
    start = int(s.starts[2])
    s.read_range(0, start + 100)
    with pytest.raises(ShardError, match=f"^{path}: checksum mismatch in block {pos // KIB} "):
        s.read_range(start + 150, start + 250)
    s.close()


def test_v2_index_without_blocks_is_checked_whole_at_open(digits):
    meta = json.load(open(os.path.join(digits, "index.json")))
    meta["version"] = 2
    for sp in meta["splits"].values():
        for e in sp["shards"]:
            del e["blocks"]
    json.dump(meta, open(os.path.join(digits, "index.json"), "w"))
    path = os.path.join(digits, SHARD)
    flip(path, x_byte(path, 200))
    s = ShardSet(read_index(digits), "train")
    assert not s.checks.blocks and "first opens it" in s.describe()
    with pytest.raises(ShardError, match=f"^{path}: checksum mismatch \\(file changed or truncated\\)$"):
        s.read_range(int(s.starts[2]), int(s.starts[2]) + 1)     # before any sample: the whole file
    s.close()


def test_verify_tool_names_the_bad_block(digits):
    from hpctrain.data_tools.inspection import verify
    path = os.path.join(digits, SHARD)
    pos = x_byte(path, 300)
    flip(path, pos)
    with pytest.raises(ShardError, match=f"{path}: checksum mismatch in block {pos // KIB} "):
        verify(digits)


@pytest.mark.parametrize("change,want", [
    (lambda b: b.update(data=[[5, 3]]), "'data' must hold ascending block ranges"),
    (lambda b: b["xxh3_128"].pop(), "'xxh3_128' must list .* of 32 hex digits"),
    (lambda b: b.update(sha256=b["xxh3_128"]), "one digest list"),
    (lambda b: b.update(md5=b.pop("xxh3_128")), "one digest list \\('xxh3_128' or 'sha256'\\)"),
    (lambda b: b.update(bytes=0), "'bytes' > 0"),
    (lambda b: b.pop("file_bytes"), "expected an object with"),
])
def test_bad_blocks_field_is_one_line(digits, change, want):
    meta = json.load(open(os.path.join(digits, "index.json")))
    change(meta["splits"]["train"]["shards"][1]["blocks"])
    json.dump(meta, open(os.path.join(digits, "index.json"), "w"))
    with pytest.raises(ShardError, match=f"split 'train' shard 1 field 'blocks': .*{want}"):
        read_index(digits)


def test_truncated_file_is_refused_at_open_by_its_size(digits):
    path = os.path.join(digits, SHARD)
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 10)
    s = ShardSet(read_index(digits), "train")
    with pytest.raises(ShardError, match=f"{path}: checksum mismatch: file has .* bytes, index says"):
        s.read_range(int(s.starts[2]), int(s.starts[2]) + 1)
    s.close()
