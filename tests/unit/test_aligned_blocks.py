"""Index v5: the digest grid lines up with the loader's sample runs.

Samples of 500 bytes with ``block_bytes=4000`` target: blocks of 8 rows (4000 bytes, the power of
two nearest 4000/500), the grid passing through the byte where ``x`` starts (6144 here, so the
origin is not 0). The expected byte ranges are laid here from h5py's own offsets, the digests
are xxhash's own; a run of the plan (32 samples, starting at a multiple of 32 in the split and so,
with shards cut at multiples of 32, in its file) reads nothing on the side. Nothing here imports
v5-only names, so the file runs against the old writer too (it fails there: no origin, 4096-byte
blocks, side reads).
"""
import json
import os
import shutil

import h5py
import numpy as np
import pytest
import xxhash

from hpctrain.data import ShardError, ShardLoader, ShardSet, read_index
from hpctrain.data.blocks import BlockCheck
from hpctrain.data_tools.sources import from_arrays
from hpctrain.data_tools.writer import convert
from tests.shard_files import flip

SHAPE, ROW, ROWS = (5, 10, 10), 500, 8          # 8 rows of 500 bytes: the block
N = 200
SHARD = "train-00001-of-00002.h5"


@pytest.fixture(scope="module")
def aligned_src(tmp_path_factory):
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 256, (N, *SHAPE), dtype=np.uint8), rng.integers(0, 5, N)
    out = str(tmp_path_factory.mktemp("aligned") / "ds")
    convert(from_arrays({"train": (x, y)}, [str(c) for c in range(5)], "src"), out, 2, resume=False,
            block_bytes=4000)
    return out


@pytest.fixture
def ds(aligned_src, tmp_path):
    return str(shutil.copytree(aligned_src, tmp_path / "ds"))


def layout(path: str) -> tuple[int, int, int]:
    """x's first byte, y's first byte and the file's size, from h5py and the file system."""
    with h5py.File(path, "r") as fh:
        return fh["x"].id.get_offset(), fh["y"].id.get_offset(), os.path.getsize(path)


def ranges(path: str) -> list[tuple[int, int]]:
    """The blocks as they must be: ``ROWS * ROW`` bytes each, one boundary at x's start; the
    first block is the short head before the first boundary."""
    x0, _, size = layout(path)
    b = ROWS * ROW
    cuts = [0] + list(range(x0 % b or b, size, b)) + [size]
    return list(zip(cuts, cuts[1:]))


def entry(d: str, name: str = SHARD) -> dict:
    return next(e for e in read_index(d).split("train")["shards"] if e["file"] == name)


def test_shards_start_at_multiples_of_32_samples(aligned_src):
    assert [e["num_samples"] for e in read_index(aligned_src).split("train")["shards"]] == [96, 104]


def test_v5_digests_are_xxh3_of_the_row_aligned_byte_ranges(aligned_src):
    assert json.load(open(os.path.join(aligned_src, "index.json")))["version"] == 5
    for name in ("train-00000-of-00002.h5", SHARD):
        path = os.path.join(aligned_src, name)
        raw, want, blocks = open(path, "rb").read(), ranges(path), entry(aligned_src, name)["blocks"]
        x0, y0, _ = layout(path)
        assert blocks["bytes"] == ROWS * ROW and blocks["origin"] == x0 % (ROWS * ROW) - ROWS * ROW != 0
        assert blocks["xxh3_128"] == [xxhash.xxh3_128_hexdigest(raw[a:e]) for a, e in want]
        data = [k for a, c in blocks["data"] for k in range(a, c)]     # the blocks of x, as laid above
        assert [want[k] for k in data] == [(a, e) for a, e in want if x0 <= a and e <= y0]


def where(path: str) -> dict:
    x0, y0, size = layout(path)
    return {"first block": 10, "metadata": 800, "inside x": x0 + 37 * ROW + 123,
            "middle": x0 + (y0 - x0) // 2, "inside y": y0 + 8 * 50 + 3, "last block": size - 1}


@pytest.mark.parametrize("place", ["first block", "metadata", "inside x", "middle", "inside y", "last block"])
def test_a_flipped_byte_in_any_block_is_refused_naming_file_and_block(ds, place):
    path = os.path.join(ds, SHARD)
    pos = where(path)[place]
    k, (a, e) = next((k, r) for k, r in enumerate(ranges(path)) if r[0] <= pos < r[1])
    flip(path, pos)
    s = ShardSet(read_index(ds), "train")
    with pytest.raises(ShardError) as err:
        for start in range(0, N, 32):
            s.read_range(start, min(N, start + 32))
    s.close()
    assert str(err.value) == f"{path}: checksum mismatch in block {k} (bytes {a}..{e}; file changed or corrupted)"


class SideReads:
    """Counts the calls of ``check_read``'s ``read_bytes`` (the parts of cut blocks read on the side)."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[int, int]] = []
        real = BlockCheck.check_read

        def counted(check, pos, view, read_bytes, pool):
            def side(at, buf):
                self.calls.append((at, len(buf)))
                read_bytes(at, buf)
            return real(check, pos, view, side, pool)
        monkeypatch.setattr(BlockCheck, "check_read", counted)


def test_a_read_of_whole_sample_runs_reads_nothing_on_the_side(aligned_src, monkeypatch):
    side = SideReads(monkeypatch)
    s = ShardSet(read_index(aligned_src), "train")
    ref = ShardSet(read_index(aligned_src), "train", verify="off")
    for start in (128, 0, 160, 32, 96, 64):                  # runs of 32: shard 0 holds 0..96
        np.testing.assert_array_equal(s.read_range(start, start + 32)[0], ref.read_range(start, start + 32)[0])
    assert side.calls == [] and s.checks.blocks[0].done[s.checks.blocks[0].data].all()
    done = s.checks.blocks[1].done
    assert not done[14] and done[2:14].all()                # shard 1's samples 0..96: blocks 2..14
    s.read_range(3, 20)                                     # inside blocks already checked: not read again
    s.read_range(N - 8, N)                                  # the last 8 samples: one whole block
    assert side.calls == [] and all(c.done[c.data].all() for c in s.checks.blocks.values())
    s.close()
    ref.close()


def test_a_loader_epoch_reads_nothing_on_the_side(aligned_src, monkeypatch):
    side = SideReads(monkeypatch)
    s, off = ShardSet(read_index(aligned_src), "train"), ShardSet(read_index(aligned_src), "train", verify="off")
    kw = dict(rank=0, size=1, batch_size=16, block_size=32, shuffle_window=64, prefetch=2)
    a, b = ShardLoader(s, **kw), ShardLoader(off, **kw)
    for (x1, y1), (x2, y2) in zip(a.epoch(0), b.epoch(0), strict=True):
        assert np.array_equal(x1.numpy(), x2.numpy()) and np.array_equal(y1.numpy(), y2.numpy())
    assert side.calls == [] and all(c.done.any() for c in s.checks.blocks.values())
    for part in (a, b, s, off):
        part.close()


def test_a_read_inside_a_block_still_reads_its_rest_on_the_side(aligned_src, monkeypatch):
    """The counter sees side reads where there are some: the test above can fail."""
    side = SideReads(monkeypatch)
    s = ShardSet(read_index(aligned_src), "train")
    s.read_range(3, 20)
    x0 = layout(os.path.join(aligned_src, "train-00000-of-00002.h5"))[0]
    assert side.calls == [(x0, 3 * ROW), (x0 + 20 * ROW, 4 * ROW)]
    s.close()


def test_a_v4_entry_without_origin_still_verifies(ds):
    """The same files indexed as v4 (blocks of 4096 bytes from byte 0, no origin): clean reads pass,
    a flipped byte is refused naming the 4096-byte block."""
    meta = json.load(open(os.path.join(ds, "index.json")))
    meta["version"] = 4
    for e in meta["splits"]["train"]["shards"]:
        raw = open(os.path.join(ds, e["file"]), "rb").read()
        x0, y0, _ = layout(os.path.join(ds, e["file"]))
        e["blocks"] = {"bytes": 4096, "file_bytes": len(raw), "data": [[-(-x0 // 4096), y0 // 4096]],
                       "xxh3_128": [xxhash.xxh3_128_hexdigest(raw[k:k + 4096]) for k in range(0, len(raw), 4096)]}
    json.dump(meta, open(os.path.join(ds, "index.json"), "w"))
    s = ShardSet(read_index(ds), "train")
    ref = ShardSet(read_index(ds), "train", verify="off")
    np.testing.assert_array_equal(s.read_range(0, N)[0], ref.read_range(0, N)[0])
    assert all(c.done.all() for c in s.checks.blocks.values())
    s.close()
    path = os.path.join(ds, SHARD)
    pos = layout(path)[0] + 50 * ROW + 1
    flip(path, pos)
    s = ShardSet(read_index(ds), "train")
    with pytest.raises(ShardError) as err:
        s.read_range(96, N)
    k = pos // 4096
    assert str(err.value) == f"{path}: checksum mismatch in block {k} (bytes {k * 4096}..{k * 4096 + 4096}; " \
                             f"file changed or corrupted)"
    s.close()
    ref.close()


@pytest.mark.parametrize("origin", [1, -4000, "0", True, 0.5])
def test_bad_origin_is_one_line(ds, origin):
    meta = json.load(open(os.path.join(ds, "index.json")))
    meta["splits"]["train"]["shards"][1]["blocks"]["origin"] = origin
    json.dump(meta, open(os.path.join(ds, "index.json"), "w"))
    with pytest.raises(ShardError) as err:
        read_index(ds)
    assert str(err.value) == (f"{os.path.join(ds, 'index.json')}: split 'train' shard 1 field 'blocks': "
                              f"'origin' is {origin!r}, expected an integer in -3999..0")


def test_sha256_blocks_keep_the_v3_grid_from_byte_0(tmp_path):
    """``--block-digest sha256`` is for readers before v4: a version 3 index, blocks from byte 0."""
    import hashlib
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 256, (N, *SHAPE), dtype=np.uint8), rng.integers(0, 5, N)
    out = str(tmp_path / "ds")
    convert(from_arrays({"train": (x, y)}, [str(c) for c in range(5)], "src"), out, 2, resume=False,
            block_bytes=4000, block_digest="sha256")
    assert json.load(open(os.path.join(out, "index.json")))["version"] == 3
    path = os.path.join(out, SHARD)
    raw, blocks = open(path, "rb").read(), entry(out)["blocks"]
    assert "origin" not in blocks and blocks["bytes"] == 4000
    assert blocks["sha256"] == [hashlib.sha256(raw[k:k + 4000]).hexdigest() for k in range(0, len(raw), 4000)]
