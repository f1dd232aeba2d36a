"""The datasets of ``python -m hpctrain bench io`` (:mod:`hpctrain.tools.bench.io`): generated once and
reused, evicted from the page cache for the cold rows, and the v3 twin (SHA-256 blocks of 1 MiB from
byte 0, as ``--block-digest sha256`` writes them) of the v5 index.

Apart from the measuring code: these set the stage, none of it is timed.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import numpy as np

from hpctrain.data import read_index
from hpctrain.data.index import BLOCK_BYTES, BLOCK_DIGEST, INDEX, aligned_grid, write_index
from hpctrain.data.plan import shard_range
from hpctrain.data.shardwriter import ShardWriter, shard_digests

SHA_BLOCKS = "sha256-blocks.json"     # the same shards' SHA-256 block digests: the v3 rows


def n_samples(size_gb: float, shape: tuple) -> int:
    return int(size_gb * 2**30 // np.prod(shape)) + 1


def generate(directory: str, n: int, shape: tuple, n_shards: int) -> None:
    """Random uint8 image shards (rank 0), written once; the index goes last."""
    rng = np.random.default_rng(0)
    os.makedirs(directory, exist_ok=True)
    entries, chunk = [], max(1, (32 << 20) // int(np.prod(shape)))
    for i in range(n_shards):
        lo, hi = shard_range(n, n_shards, i)          # as data_tools convert cuts a split
        w = ShardWriter(directory, "train", i, n_shards, hi - lo, shape, np.uint8)
        for a in range(lo, hi, chunk):
            b = min(hi, a + chunk)
            w.write(rng.integers(0, 256, (b - a, *shape), dtype=np.uint8), rng.integers(0, 1000, b - a))
        entries.append(w.finish())
    sha = [shard_digests(os.path.join(directory, e["file"]), BLOCK_BYTES, "sha256")["blocks"] for e in entries]
    with open(os.path.join(directory, SHA_BLOCKS), "w") as fh:
        json.dump(sha, fh)
    write_index(directory, {"sample_shape": list(shape), "dtype": "uint8", "num_classes": 1000,
                            "class_names": [str(c) for c in range(1000)],
                            "normalize": {"mean": [127.5] * 3, "std": [73.9] * 3},
                            "splits": {"train": {"num_samples": n, "shards": entries}}})


def ensure(directory: str, n: int, shape: tuple, n_shards: int, comm) -> None:
    """Generate on rank 0 unless a matching dataset is already there (reused across runs)."""
    if comm.Get_rank() == 0:
        ok, grid = False, aligned_grid(BLOCK_BYTES, 0, 0, int(np.prod(shape)))
        if os.path.exists(os.path.join(directory, INDEX)):
            idx = read_index(directory)
            ok = (idx.num_samples("train") == n and tuple(idx.sample_shape) == shape
                  and os.path.exists(os.path.join(directory, SHA_BLOCKS))
                  and all(BLOCK_DIGEST in e.get("blocks", {}) and e["blocks"]["bytes"] == grid.block_bytes
                          for e in idx.split("train")["shards"]))  # older (unaligned grid, v3): redo
        if not ok:
            shutil.rmtree(directory, ignore_errors=True)
            t0 = time.perf_counter()
            generate(directory, n, shape, n_shards)
            print(f"generated {directory} in {time.perf_counter() - t0:.1f} s")
    comm.Barrier()


def drop_cache(files: list[str]) -> str:
    """Evict the files from the page cache; returns the method that worked."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "posix_fadvise(DONTNEED) (drop_caches not permitted)"


def with_sha256_blocks(index, directory: str):
    """``index`` with the SHA-256 block digests saved beside it (``generate``), as a v3 index holds them."""
    with open(os.path.join(directory, SHA_BLOCKS)) as fh:
        sha = json.load(fh)
    train = index.split("train")
    shards = [{**e, "blocks": b} for e, b in zip(train["shards"], sha)]
    return dataclasses.replace(index, splits={**index.splits, "train": {**train, "shards": shards}})
