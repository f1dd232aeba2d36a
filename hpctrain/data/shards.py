"""The HDF5 shard format (version 1): writing, the index, validation and contiguous reads.

A dataset is a directory::

    index.json                     written last, atomically; its presence means "complete"
    train-00000-of-00004.h5 …      one file per shard and split

``index.json`` holds ``format`` ("hpctrain-shards"), ``version`` (1), ``sample_shape``, ``dtype``,
``num_classes``, ``class_names``, ``normalize`` ({"mean": [...], "std": [...]} per channel, in raw
units, from the train split) and ``splits``: ``{"train": {"num_samples": N, "shards": [{"file",
"num_samples", "sha256"}, …]}, …}``. Each shard file holds datasets ``x`` (N, *sample_shape) and
``y`` (N,) int64, with attributes ``format``, ``version``, ``split``, ``shard``.
Samples are addressed by a global index per split; :meth:`ShardSet.read_range` turns a
contiguous index range into one slice per shard touched — never per-sample reads.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import h5py
import numpy as np

FORMAT = "hpctrain-shards"
VERSION = 1
INDEX = "index.json"


class ShardError(Exception):
    """A shard directory or file is missing, truncated or inconsistent (message names the file)."""


def shard_name(split: str, i: int, n: int) -> str:
    return f"{split}-{i:05d}-of-{n:05d}.h5"


def file_sha256(path: str, chunk_bytes: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def atomic_write_text(path: str, text: str) -> None:
    """Write to a temporary name, fsync, rename: readers see the old file or the new one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_shard(directory: str, split: str, i: int, n: int, x: np.ndarray, y: np.ndarray) -> dict:
    """Write one shard atomically; returns its index entry."""
    name = shard_name(split, i, n)
    path = os.path.join(directory, name)
    tmp = f"{path}.tmp.{os.getpid()}"
    with h5py.File(tmp, "w") as fh:
        fh.create_dataset("x", data=x)
        fh.create_dataset("y", data=y.astype(np.int64))
        fh.attrs.update({"format": FORMAT, "version": VERSION, "split": split, "shard": i})
    os.replace(tmp, path)
    return {"file": name, "num_samples": int(len(x)), "sha256": file_sha256(path)}


def write_index(directory: str, meta: dict) -> None:
    meta = {"format": FORMAT, "version": VERSION, **meta}
    atomic_write_text(os.path.join(directory, INDEX), json.dumps(meta, indent=1))


@dataclass(frozen=True)
class ShardIndex:
    directory: str
    sample_shape: tuple
    dtype: str
    num_classes: int
    class_names: list
    normalize: dict
    splits: dict

    def num_samples(self, split: str) -> int:
        return int(self.split(split)["num_samples"])

    def split(self, split: str) -> dict:
        if split not in self.splits:
            raise ShardError(f"{os.path.join(self.directory, INDEX)}: no split {split!r} "
                             f"(has {', '.join(self.splits)})")
        return self.splits[split]


def read_index(directory: str) -> ShardIndex:
    """Load and check ``DIR/index.json``; every problem is one ShardError line naming the file."""
    path = os.path.join(directory, INDEX)
    if not os.path.isdir(directory):
        raise ShardError(f"{directory}: shard directory not found")
    if not os.path.exists(path):
        raise ShardError(f"{path}: missing (not a shard directory, or conversion did not finish)")
    try:
        with open(path) as fh:
            meta = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ShardError(f"{path}: unreadable index ({exc})") from None
    if meta.get("format") != FORMAT:
        raise ShardError(f"{path}: field 'format' is {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise ShardError(f"{path}: field 'version' is {meta.get('version')!r}, this hpctrain reads {VERSION}")
    for key in ("sample_shape", "dtype", "num_classes", "splits"):
        if key not in meta:
            raise ShardError(f"{path}: missing field {key!r}")
    for name, sp in meta["splits"].items():
        counted = sum(s["num_samples"] for s in sp["shards"])
        if counted != sp["num_samples"]:
            raise ShardError(f"{path}: split {name!r} says {sp['num_samples']} samples, shards hold {counted}")
    return ShardIndex(directory=directory, sample_shape=tuple(meta["sample_shape"]), dtype=meta["dtype"],
                      num_classes=int(meta["num_classes"]), class_names=list(meta.get("class_names", [])),
                      normalize=meta.get("normalize", {}), splits=meta["splits"])


class ShardSet:
    """One split of a shard directory, read by global sample index in contiguous ranges.

    Files are opened lazily and kept open; each opened file is checked against the index
    (sample count, shape, dtype) so a truncated or foreign file fails with its name.
    """

    def __init__(self, index: ShardIndex, split: str):
        self.index = index
        self.split_name = split
        self.entries = index.split(split)["shards"]
        counts = [e["num_samples"] for e in self.entries]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_samples = int(self.starts[-1])
        self._files: dict[int, h5py.File] = {}

    def _open(self, i: int) -> h5py.File:
        if i in self._files:
            return self._files[i]
        entry = self.entries[i]
        path = os.path.join(self.index.directory, entry["file"])
        if not os.path.exists(path):
            raise ShardError(f"{path}: shard file missing")
        try:
            fh = h5py.File(path, "r")
        except OSError as exc:
            raise ShardError(f"{path}: cannot open shard (truncated or not HDF5: {exc})") from None
        try:
            x, y = fh["x"], fh["y"]
        except KeyError as exc:
            fh.close()
            raise ShardError(f"{path}: missing dataset {exc}") from None
        want = (entry["num_samples"], *self.index.sample_shape)
        if x.shape != want or y.shape != (entry["num_samples"],):
            fh.close()
            raise ShardError(f"{path}: dataset 'x' has shape {x.shape}, index says {want}")
        if str(x.dtype) != self.index.dtype:
            fh.close()
            raise ShardError(f"{path}: dataset 'x' has dtype {x.dtype}, index says {self.index.dtype}")
        self._files[i] = fh
        return fh

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Samples ``[start, stop)`` of the split as arrays, one contiguous slice per shard."""
        if not 0 <= start <= stop <= self.num_samples:
            raise IndexError(f"range [{start}, {stop}) outside split of {self.num_samples}")
        xs, ys = [], []
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        pos = start
        while pos < stop:
            fh = self._open(i)
            lo = pos - int(self.starts[i])
            hi = min(stop, int(self.starts[i + 1])) - int(self.starts[i])
            try:
                xs.append(fh["x"][lo:hi])
                ys.append(fh["y"][lo:hi])
            except OSError as exc:
                path = os.path.join(self.index.directory, self.entries[i]["file"])
                raise ShardError(f"{path}: read of samples {lo}..{hi} failed (truncated? {exc})") from None
            pos += hi - lo
            i += 1
        if not xs:
            return (np.empty((0, *self.index.sample_shape), self.index.dtype), np.empty(0, np.int64))
        return np.concatenate(xs), np.concatenate(ys)

    def check(self) -> None:
        """Open every shard and check it against the index (cheap: metadata only)."""
        for i in range(len(self.entries)):
            self._open(i)

    def verify(self) -> None:
        """Check every shard's SHA-256 against the index (reads every byte)."""
        for e in self.entries:
            path = os.path.join(self.index.directory, e["file"])
            if not os.path.exists(path):
                raise ShardError(f"{path}: shard file missing")
            if file_sha256(path) != e["sha256"]:
                raise ShardError(f"{path}: checksum mismatch (file changed or truncated)")

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()
