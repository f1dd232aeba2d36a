"""Write ``{split: (x, y)}`` arrays as hpctrain shards; the index goes last, atomically."""
from __future__ import annotations

import os

import numpy as np

from hpctrain.data.plan import block_range
from hpctrain.data.shards import INDEX, write_index, write_shard


def channel_stats(x: np.ndarray) -> dict:
    """Per-channel mean/std of (N, C, ...) samples in raw units (float64 accumulation)."""
    c = x.shape[1] if x.ndim > 1 else 1
    flat = x.reshape(len(x), c, -1).astype(np.float64)
    mean = flat.mean(axis=(0, 2))
    std = flat.std(axis=(0, 2))
    return {"mean": mean.tolist(), "std": np.where(std > 0, std, 1.0).tolist()}


def write_dataset(out: str, splits: dict, class_names: list, n_shards: int = 1) -> dict:
    """Write every split in ``n_shards`` shards, then ``index.json``; returns the index dict."""
    os.makedirs(out, exist_ok=True)
    index_path = os.path.join(out, INDEX)
    if os.path.exists(index_path):
        os.remove(index_path)          # an index claims completeness: never leave a stale one
    first = next(iter(splits.values()))[0]
    meta = {"sample_shape": list(first.shape[1:]), "dtype": str(first.dtype),
            "num_classes": len(class_names), "class_names": class_names,
            "normalize": channel_stats(splits["train"][0] if "train" in splits else first), "splits": {}}
    for split, (x, y) in splits.items():
        if y.size and int(y.max()) >= len(class_names):
            raise ValueError(f"split {split}: label {int(y.max())} out of range for {len(class_names)} classes")
        n = min(n_shards, max(len(x), 1))
        entries = []
        for i in range(n):
            lo, hi = block_range(len(x), n, i)
            entries.append(write_shard(out, split, i, n, x[lo:hi], y[lo:hi]))
        meta["splits"][split] = {"num_samples": int(len(x)), "shards": entries}
    write_index(out, meta)
    return meta
