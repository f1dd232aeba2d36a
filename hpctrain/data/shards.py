"""The HDF5 shard format (version 2; version 1 is read too): writing, the index, validation, reads.

A dataset is a directory::

    index.json                     written last, atomically; its presence means "complete"
    train-00000-of-00004.h5 …      one file per shard and split

``index.json`` holds ``format`` ("hpctrain-shards"), ``version`` (2), ``sample_shape``, ``dtype``,
``num_classes``, ``class_names``, ``normalize`` ({"mean": [...], "std": [...]} per channel, in raw
units, from the train split) and ``splits``: ``{"train": {"num_samples": N, "shards": [{"file",
"num_samples", "sha256"}, …]}, …}``. Each shard file holds datasets ``x`` (N, *sample_shape) and
``y`` (N,) int64, with attributes ``format``, ``version``, ``split``, ``shard``.

Version 2 adds ``encoding``: ``"raw"`` (the v1 layout; a v1 index means raw) or ``"jpeg"``, where
``x`` is (N,) variable-length uint8 (h5py ``vlen_dtype``), one encoded image per sample, and
``sample_shape``/``dtype`` describe the *decoded* sample the loader produces (``images.py``).
Files are written by ``shardwriter.py``. Samples are addressed by a global index per split;
:meth:`ShardSet.read_range` turns a contiguous index range into one slice per shard touched —
never per-sample reads.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import weakref
from dataclasses import dataclass

import h5py
import numpy as np

from hpctrain.data.direct import DirectExtent
from hpctrain.data.hdf5 import choose_driver, open_read

FORMAT = "hpctrain-shards"
VERSION = 2
READABLE_VERSIONS = (1, 2)
ENCODINGS = ("raw", "jpeg")
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
    encoding: str = "raw"

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
    if meta.get("version") not in READABLE_VERSIONS:
        raise ShardError(f"{path}: field 'version' is {meta.get('version')!r}, this hpctrain reads "
                         f"{', '.join(map(str, READABLE_VERSIONS))}")
    if meta.get("encoding", "raw") not in ENCODINGS:
        raise ShardError(f"{path}: field 'encoding' is {meta.get('encoding')!r}, expected one of {ENCODINGS}")
    for key in ("sample_shape", "dtype", "num_classes", "splits"):
        if key not in meta:
            raise ShardError(f"{path}: missing field {key!r}")
    for name, sp in meta["splits"].items():
        counted = sum(s["num_samples"] for s in sp["shards"])
        if counted != sp["num_samples"]:
            raise ShardError(f"{path}: split {name!r} says {sp['num_samples']} samples, shards hold {counted}")
    return ShardIndex(directory=directory, sample_shape=tuple(meta["sample_shape"]), dtype=meta["dtype"],
                      num_classes=int(meta["num_classes"]), class_names=list(meta.get("class_names", [])),
                      normalize=meta.get("normalize", {}), splits=meta["splits"],
                      encoding=meta.get("encoding", "raw"))


class ShardSet:
    """One split of a shard directory, read by global sample index in contiguous ranges.

    Each opened file is checked against the index (sample count, shape, dtype) so a truncated or
    foreign file fails with its name; labels are range-checked on every read. With the serial
    driver files open lazily; with ``mpio`` (``comm`` given, see ``hdf5.py``) all of them open
    collectively here, and :meth:`close` is collective too.
    """

    def __init__(self, index: ShardIndex, split: str, *, comm=None, driver: str = "auto"):
        self.index = index
        self.split_name = split
        self.entries = index.split(split)["shards"]
        counts = [e["num_samples"] for e in self.entries]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_samples = int(self.starts[-1])
        self.comm = comm
        self.driver, self.driver_reason = choose_driver(driver, comm)
        self._files: dict[int, h5py.File] = {}
        self._datasets: dict[int, tuple] = {}
        self._direct: dict[int, tuple] = {}       # (x, y) DirectExtent or None, serial driver only
        self._fds: dict[int, int] = {}
        atexit.register(_close_at_exit, weakref.ref(self))   # before h5py tears files down at exit
        if self.driver == "mpio":
            for i in range(len(self.entries)):
                self._open(i)

    def path(self, i: int) -> str:
        return os.path.join(self.index.directory, self.entries[i]["file"])

    def describe(self) -> str:
        """One line for the start-up log: driver, why, files, sample layout."""
        how = (f"parallel HDF5 (driver='mpio', collective open over {self.comm.Get_size()} ranks, "
               f"independent reads)" if self.driver == "mpio" else
               f"serial per-shard files, contiguous datasets read by pread ({self.driver_reason})")
        return (f"data {self.split_name}: {how}; {len(self.entries)} shard(s), {self.num_samples} samples, "
                f"{self.index.encoding} {self.index.dtype} {tuple(self.index.sample_shape)}")

    def _open(self, i: int) -> h5py.File:
        if i in self._files:
            return self._files[i]
        entry, path = self.entries[i], self.path(i)
        if not os.path.exists(path):
            raise ShardError(f"{path}: shard file missing")
        try:
            fh = open_read(path, self.driver, self.comm)
        except OSError as exc:
            raise ShardError(f"{path}: cannot open shard (truncated or not HDF5: {exc})") from None
        try:
            self._check(fh, entry, path)
        except ShardError:
            fh.close()
            raise
        self._files[i] = fh
        self._datasets[i] = (fh["x"], fh["y"])       # a lookup by name costs ~0.5 ms: do it once
        if self.driver == "serial":
            self._direct_extents(i, path)
        return fh

    def _direct_extents(self, i: int, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        extents = [DirectExtent.of(ds, path, fd) for ds in self._datasets[i]]
        size = os.fstat(fd).st_size
        for name, ext in zip("xy", extents):
            if ext is not None and ext.end() > size:
                os.close(fd)
                self.close_one(i)
                raise ShardError(f"{path}: truncated: dataset {name!r} ends at byte {ext.end()}, file has {size}")
        self._fds[i] = fd
        self._direct[i] = tuple(extents)

    def close_one(self, i: int) -> None:
        self._datasets.pop(i, None)
        self._direct.pop(i, None)
        if i in self._fds:
            os.close(self._fds.pop(i))
        if i in self._files:
            self._files.pop(i).close()

    def _check(self, fh: h5py.File, entry: dict, path: str) -> None:
        for key in ("x", "y"):
            if key not in fh:
                raise ShardError(f"{path}: missing dataset {key!r}")
        x, y, n = fh["x"], fh["y"], entry["num_samples"]
        if self.index.encoding == "jpeg":
            want, ok_dtype = (n,), h5py.check_vlen_dtype(x.dtype) == np.dtype(np.uint8)
            want_dtype = "variable-length uint8"
        else:
            want, ok_dtype = (n, *self.index.sample_shape), str(x.dtype) == self.index.dtype
            want_dtype = self.index.dtype
        if x.shape != want:
            raise ShardError(f"{path}: dataset 'x' has shape {x.shape}, index says {want}")
        if not ok_dtype:
            raise ShardError(f"{path}: dataset 'x' has dtype {x.dtype}, index says {want_dtype}")
        if y.shape != (n,):
            raise ShardError(f"{path}: dataset 'y' has shape {y.shape}, index says {(n,)}")
        if not np.issubdtype(y.dtype, np.integer):
            raise ShardError(f"{path}: dataset 'y' has dtype {y.dtype}, expected integer labels")

    def _check_labels(self, y: np.ndarray, i: int, lo: int) -> None:
        bad = np.flatnonzero((y < 0) | (y >= self.index.num_classes))
        if bad.size:
            k = int(bad[0])
            raise ShardError(f"{self.path(i)}: sample {lo + k} (global {int(self.starts[i]) + lo + k}) has label "
                             f"{int(y[k])}, outside 0..{self.index.num_classes - 1}")

    def _pieces(self, start: int, stop: int):
        """``(shard, lo, hi, offset)`` of each shard's slice of ``[start, stop)``."""
        if not 0 <= start <= stop <= self.num_samples:
            raise IndexError(f"range [{start}, {stop}) outside split of {self.num_samples}")
        i, pos = int(np.searchsorted(self.starts, start, side="right")) - 1, start
        while pos < stop:
            lo = pos - int(self.starts[i])
            hi = min(stop, int(self.starts[i + 1])) - int(self.starts[i])
            yield i, lo, hi, pos - start
            pos += hi - lo
            i += 1

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Samples ``[start, stop)`` of the split, one contiguous slice per shard touched.

        ``raw``: an (n, *sample_shape) array; ``jpeg``: an (n,) object array of encoded bytes.
        """
        jpeg = self.index.encoding == "jpeg"
        x = np.empty((stop - start,) if jpeg else (stop - start, *self.index.sample_shape),
                     object if jpeg else self.index.dtype) if 0 <= start <= stop else None
        y = np.empty(stop - start, np.int64) if x is not None else None
        self.read_into(start, stop, x, y)
        return x, y

    def read_into(self, start: int, stop: int, x: np.ndarray, y: np.ndarray) -> None:
        """Read samples ``[start, stop)`` into ``x[:n]``, ``y[:n]`` (raw: straight from HDF5, no copy)."""
        for i, lo, hi, off in self._pieces(start, stop):
            self._open(i)
            dx, dy = self._datasets[i]
            ex, ey = self._direct.get(i, (None, None))
            n = hi - lo
            try:
                if ex is not None:
                    ex.read_into(lo, hi, x[off:off + n])
                elif self.index.encoding == "jpeg":
                    x[off:off + n] = dx[lo:hi]
                elif n:
                    dx.read_direct(x, np.s_[lo:hi], np.s_[off:off + n])
                if ey is not None and dy.dtype == np.int64:
                    ey.read_into(lo, hi, y[off:off + n])
                else:
                    y[off:off + n] = dy[lo:hi]
            except OSError as exc:
                raise ShardError(f"{self.path(i)}: read of samples {lo}..{hi} failed (truncated? {exc})") from None
            self._check_labels(y[off:off + n], i, lo)

    def check(self) -> None:
        """Open every shard and check it against the index (cheap: metadata only)."""
        for i in range(len(self.entries)):
            self._open(i)

    def check_labels(self) -> None:
        """Read every label and range-check it (small: 8 bytes per sample)."""
        for i in range(len(self.entries)):
            self._open(i)
            self._check_labels(self._datasets[i][1][:], i, 0)

    def verify(self) -> None:
        """Check every shard's SHA-256 against the index (reads every byte)."""
        for i, e in enumerate(self.entries):
            path = self.path(i)
            if not os.path.exists(path):
                raise ShardError(f"{path}: shard file missing")
            if file_sha256(path) != e["sha256"]:
                raise ShardError(f"{path}: checksum mismatch (file changed or truncated)")

    def close(self) -> None:
        """Close the open files (collective with ``mpio``: every rank must call it)."""
        for i in sorted(self._files):
            self.close_one(i)


def _close_at_exit(ref) -> None:
    shards = ref()
    if shards is not None:
        shards.close()
