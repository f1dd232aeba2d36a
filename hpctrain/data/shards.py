"""Reading one split of a shard directory (format: :mod:`hpctrain.data.index`): validation of
each file against the index, contiguous reads. Integrity (``ShardSet(verify=…)``: every byte
matched against the index's digests before it is used) is :mod:`hpctrain.data.shard_checks`'s.
"""
from __future__ import annotations

import atexit
import os
import weakref

import h5py
import numpy as np

from hpctrain.data.direct import DirectExtent
from hpctrain.data.hdf5 import choose_driver, open_read
from hpctrain.data.index import ShardError, ShardIndex
from hpctrain.data.shard_checks import ShardChecks

VERIFY_MODES = ("shared", "node", "off")        # ShardSet(verify=...); what each does: shard_checks


class ShardSet:
    """One split of a shard directory, read by global sample index in contiguous ranges.

    Each opened file is checked against the index (sample count, shape, dtype) so a truncated or
    foreign file fails with its name; labels are range-checked on every read. ``verify`` (see
    :mod:`hpctrain.data.shard_checks`; what has been checked: ``checks``): with ``comm`` given,
    construction is collective — every shard's metadata blocks (v3) or whole file (v1/v2) are
    checked here, shared over the ranks, before anything is opened; without, by this process when
    it first opens the shard. Data blocks (v3) are checked as they are first read.
    ``per_block=False`` ignores the block digests (the whole-file check). With the serial driver
    files open lazily; with ``mpio`` (see ``hdf5.py``) all of them open collectively here, and
    :meth:`close` is collective too.
    """

    def __init__(self, index: ShardIndex, split: str, *, comm=None, driver: str = "auto",
                 verify: str = "shared", per_block: bool = True):
        if verify not in VERIFY_MODES:
            raise ValueError(f"shard verification {verify!r}: expected one of {' | '.join(VERIFY_MODES)}")
        self.index = index
        self.split_name = split
        self.entries = index.split(split)["shards"]
        # index v3, read by pread: data blocks checked as read, the rest at open (shard_checks)
        self.checks = ShardChecks([self.path(i) for i in range(len(self.entries))], self.entries, verify,
                                  on_read=per_block and index.encoding == "raw")
        counts = [e["num_samples"] for e in self.entries]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_samples = int(self.starts[-1])
        self.comm = comm
        self.driver, self.driver_reason = choose_driver(driver, comm)
        self._files: dict[int, h5py.File] = {}
        self._datasets: dict[int, tuple] = {}
        self._direct: dict[int, tuple] = {}       # (x, y) DirectExtent or None, serial driver only
        self._stored: dict[int, tuple] = {}       # (x, y) extents whose bytes HDF5 reads as stored (mpio)
        self._fds: dict[int, int] = {}
        self._seen: dict[int, tuple[int, int]] = {}   # (size, mtime_ns) of each open file when last checked
        atexit.register(_close_at_exit, weakref.ref(self))   # before h5py tears files down at exit
        if verify != "off" and comm is not None:
            self.checks.collective(comm, index.directory)
        if self.driver == "mpio":
            for i in range(len(self.entries)):
                self._open(i)

    def path(self, i: int) -> str:
        return os.path.join(self.index.directory, self.entries[i]["file"])

    def describe(self) -> str:
        """One line for the start-up log: driver, why, files, sample layout, integrity check."""
        how = (f"parallel HDF5 (driver='mpio', collective open over {self.comm.Get_size()} ranks, "
               f"independent reads)" if self.driver == "mpio" else
               f"serial per-shard files, contiguous datasets read by pread ({self.driver_reason})")
        return (f"data {self.split_name}: {how}; {len(self.entries)} shard(s), {self.num_samples} samples, "
                f"{self.index.encoding} {self.index.dtype} {tuple(self.index.sample_shape)}; "
                f"{self.checks.describe()}")

    def mark_verified(self, shards) -> None:
        """Trust ``shards`` as checked by another process reading the same files (the node reader)."""
        self.checks.mark_verified(shards)

    def _open(self, i: int) -> h5py.File:
        if i in self._files:
            return self._files[i]
        entry, path = self.entries[i], self.path(i)
        self.checks.before_open(i)                  # without a communicator: at first open, here
        if not os.path.exists(path):
            raise ShardError(f"{path}: shard file missing")
        try:
            st = os.stat(path)
            fh = open_read(path, self.driver, self.comm)
        except OSError as exc:
            raise ShardError(f"{path}: cannot open shard (truncated or not HDF5: {exc})") from None
        self._seen[i] = (st.st_size, st.st_mtime_ns)
        try:
            self._check(fh, entry, path)
        except ShardError:
            fh.close()
            raise
        self._files[i] = fh
        self._datasets[i] = (fh["x"], fh["y"])       # a lookup by name opens the object anew: do it once
        if self.driver == "serial":
            self._direct_extents(i, path)
        elif i in self.checks.blocks:
            self._stored[i] = tuple(DirectExtent.of(ds, path, -1) for ds in self._datasets[i])
        if i in self.checks.blocks:
            self._check_unread_blocks(i)
        return fh

    def _check_unread_blocks(self, i: int) -> None:
        """Data blocks that this set will not read by ``pread`` (read through HDF5) are checked now."""
        (ex, ey), dy = self._direct.get(i) or self._stored.get(i, (None, None)), self._datasets[i][1]
        extents = [(e.offset, e.end()) for e in (ex, ey if dy.dtype == np.int64 else None) if e is not None]
        problem = self.checks.unread_blocks(i, extents)
        if problem:
            self.close_one(i)
            raise ShardError(problem)

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
        self._stored.pop(i, None)
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
        n = stop - start if 0 <= start <= stop else 0    # a bad range: read_into raises IndexError
        x = np.empty((n,) if jpeg else (n, *self.index.sample_shape), object if jpeg else self.index.dtype)
        y = np.empty(n, np.int64)
        self.read_into(start, stop, x, y)
        return x, y

    def read_into(self, start: int, stop: int, x: np.ndarray, y: np.ndarray) -> None:
        """Read samples ``[start, stop)`` into ``x[:n]``, ``y[:n]`` (raw: straight from HDF5, no copy).

        After each shard's piece, the file is checked to be the one opened (:meth:`_unchanged`):
        HDF5's ``mpio`` driver returns zeros past the end of a truncated file rather than an
        error, and a block checked once would otherwise be trusted after the file changed."""
        for i, lo, hi, off in self._pieces(start, stop):
            self._open(i)
            self._read_piece(i, lo, hi, off, x, y)
            if not self._unchanged(i):          # modified, same size: read again, every block checked anew
                self._read_piece(i, lo, hi, off, x, y)

    def _unchanged(self, i: int) -> bool:
        """Whether shard ``i`` still has the size the index gives (else the size it had at open) and
        its modification time; a size changed raises :class:`ShardError`; a time changed (same size)
        forgets what was checked of it (:meth:`ShardChecks.changed`) and returns False."""
        path, (size, mtime_ns) = self.path(i), self._seen[i]
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ShardError(f"{path}: shard file gone while the job reads it ({exc.strerror or exc})") from None
        want = (self.entries[i].get("blocks") or {}).get("file_bytes", size)
        if st.st_size != want or st.st_size != size:
            raise ShardError(f"{path}: changed while the job reads it: now {st.st_size} bytes, {want} expected "
                             f"(truncated or rewritten); restore it and resume")
        if st.st_mtime_ns == mtime_ns:
            return True
        self._seen[i] = (st.st_size, st.st_mtime_ns)
        problem = self.checks.changed(i)
        if problem:
            raise ShardError(problem)
        return False

    def _read_piece(self, i: int, lo: int, hi: int, off: int, x: np.ndarray, y: np.ndarray) -> None:
        dx, dy = self._datasets[i]
        ex, ey = self._direct.get(i, (None, None))
        n = hi - lo
        try:
            if ex is not None:
                self.checks.read_direct(i, ex, lo, hi, x[off:off + n])
            elif self.index.encoding == "jpeg":
                x[off:off + n] = dx[lo:hi]
            elif n:
                dx.read_direct(x, np.s_[lo:hi], np.s_[off:off + n])
                self._check_stored(i, 0, lo, hi, x[off:off + n])
            if ey is not None and dy.dtype == np.int64:
                self.checks.read_direct(i, ey, lo, hi, y[off:off + n])
            else:
                y[off:off + n] = dy[lo:hi]
                self._check_stored(i, 1, lo, hi, y[off:off + n])
        except OSError as exc:
            raise ShardError(f"{self.path(i)}: read of samples {lo}..{hi} failed (truncated? {exc})") from None
        self._check_labels(y[off:off + n], i, lo)

    def _check_stored(self, i: int, which: int, lo: int, hi: int, out: np.ndarray) -> None:
        """Rows ``[lo, hi)`` of dataset ``which`` (0: x, 1: y) just read by HDF5: their blocks checked
        where the dataset is stored as read (``mpio``); labels stored as another integer type than
        int64 had their blocks checked at open."""
        ds = self._datasets[i][which]
        if which == 0 or ds.dtype == np.int64:
            self.checks.check_stored(i, self._stored.get(i, (None, None))[which], ds, lo, hi, out)

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
        """Check every shard's SHA-256, and every block's (v3/v4), against the index now (reads every
        byte once; local, threaded)."""
        self.checks.verify_all()

    def close(self) -> None:
        """Close the open files (collective with ``mpio``: every rank must call it)."""
        for i in sorted(self._files):
            self.close_one(i)
        self.checks.close()


def _close_at_exit(ref) -> None:
    shards = ref()
    if shards is not None:
        shards.close()
