"""Reading one split of a shard directory (format: :mod:`hpctrain.data.index`): validation of
each file against the index, contiguous reads, integrity.

Integrity (``ShardSet(verify=…)``, default ``"shared"``): no byte of a shard is used before it
has matched a digest of the index. Two ways, by what the index holds:

* **per block, as read** (index v3 to v5, raw samples; :mod:`hpctrain.data.blocks`): the index lists the
  XXH3-128 (v4, v5; SHA-256 in v3) of every block of about 1 MiB of each file and which blocks lie inside
  the storage of ``x`` or ``y``. All other blocks (HDF5 metadata, free space: a few per file) are
  checked before HDF5 parses the file — with a communicator collectively at construction, shard *k* by rank
  ``k % P``, verdicts allgathered, so every rank raises the same :class:`ShardError` naming the
  shard and block. A data block is checked when a read first touches it, from the bytes just read
  into the loader's buffer (``pread``; with ``mpio``, the buffer HDF5 filled), the rest of a
  block cut by the read's ends read on the side. So the first epoch reads the data once, not
  twice; XXH3 hashes in the reading thread, SHA-256 in a small pool beside it. A mismatch is found by the rank
  that reads the block, in its loader thread: the error takes the place of the batch, so no step
  uses it; the training thread raises it and the abort hook ends every rank with that one line
  (the others wait in the step's collectives), as for a label out of range.
* **whole files, at open** (v1/v2 indexes, v3 entries without ``blocks``, JPEG shards whose
  samples live in HDF5's heap): each shard's file SHA-256, collectively at construction as
  above, or without a communicator when this process first opens the shard (in the loader's
  thread when the loader reads). It costs one extra read of the split per job, shared over the
  ranks.

Why fixed byte blocks and not an incremental hash of each file: the block plan reads shuffled
runs, never a file front to back, and a file digest cannot be assembled from pieces out of order.
Why byte blocks and not per-sample digests: they cover every byte (metadata included), need no
knowledge of the sample layout in the index, and a 1 MiB block costs 35 bytes of index (a 140 GB
dataset: 5 MB) where per-sample digests would cost one per 150 KB image or 3 KB CIFAR sample.
``"node"``: the ranks of each node share the at-open work over their own view of the files, for
node-local copies; ``"off"``: no hashing. Neither way sees a file changed on disk after its check
(labels stay range-checked on every read, and HDF5 checks its own structures).
"""
from __future__ import annotations

import atexit
import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

from hpctrain.data.blocks import BlockCheck
from hpctrain.data.direct import DirectExtent
from hpctrain.data.hdf5 import choose_driver, open_read
from hpctrain.data.index import DIGEST_LABELS, ShardError, ShardIndex, file_digests, file_sha256

VERIFY_MODES = ("shared", "node", "off")
HASH_THREADS = max(1, min(4, os.cpu_count() or 1))   # files hashed at once by one process (no comm, 1 rank)


class ShardSet:
    """One split of a shard directory, read by global sample index in contiguous ranges.

    Each opened file is checked against the index (sample count, shape, dtype) so a truncated or
    foreign file fails with its name; labels are range-checked on every read. ``verify`` (see the
    module docstring): with ``comm`` given, construction is collective — every shard's metadata
    blocks (v3) or whole file (v1/v2) are checked here, shared over the ranks, before anything is
    opened; without, by this process when it first opens the shard. Data blocks (v3) are checked
    as they are first read. ``per_block=False`` ignores the block digests (the whole-file check).
    With the serial driver files open lazily; with ``mpio`` (see ``hdf5.py``) all of them open
    collectively here, and :meth:`close` is collective too.
    """

    def __init__(self, index: ShardIndex, split: str, *, comm=None, driver: str = "auto",
                 verify: str = "shared", per_block: bool = True):
        if verify not in VERIFY_MODES:
            raise ValueError(f"shard verification {verify!r}: expected one of {' | '.join(VERIFY_MODES)}")
        self.index = index
        self.split_name = split
        self.entries = index.split(split)["shards"]
        counts = [e["num_samples"] for e in self.entries]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_samples = int(self.starts[-1])
        self.comm = comm
        self.driver, self.driver_reason = choose_driver(driver, comm)
        self.verify_mode = verify
        self.verified: set[int] = set()           # shards whose SHA-256 matched (here or on the node reader)
        self.verify_s, self.verify_ranks = 0.0, 0  # seconds this process hashed; ranks that shared the pass
        self._files: dict[int, h5py.File] = {}
        self._datasets: dict[int, tuple] = {}
        self._direct: dict[int, tuple] = {}       # (x, y) DirectExtent or None, serial driver only
        self._stored: dict[int, tuple] = {}       # (x, y) extents whose bytes HDF5 reads as stored (mpio)
        self._fds: dict[int, int] = {}
        self._hash_pool: ThreadPoolExecutor | None = None
        # index v3, read by pread: data blocks checked as read, the rest at open (module docstring)
        on_read = per_block and verify != "off" and index.encoding == "raw"
        self._blocks = {i: BlockCheck(self.path(i), e["blocks"]) for i, e in enumerate(self.entries)
                        if on_read and "blocks" in e}
        atexit.register(_close_at_exit, weakref.ref(self))   # before h5py tears files down at exit
        if verify != "off" and comm is not None:
            self._verify_collective()
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
        if self.verify_mode == "off":
            check = "checksums not checked (verify off)"
        elif self._blocks:
            first = next(iter(self._blocks.values()))
            whole = len(self.entries) - len(self._blocks)
            check = (f"{DIGEST_LABELS[first.digest]} of {first.block_bytes >> 10} KiB blocks: "
                     f"metadata blocks checked at open"
                     f"{f' over {self.verify_ranks} rank(s)' if self.verify_ranks else ''}, data blocks as first read"
                     f"{f'; {whole} shard(s) without block digests checked whole' if whole else ''}")
        elif self.verify_ranks:
            check = (f"SHA-256 of every shard checked at open, {self.verify_mode} over {self.verify_ranks} "
                     f"rank(s) ({self.verify_s:.2f} s here)")
        else:
            check = "SHA-256 of each shard checked when this process first opens it"
        return (f"data {self.split_name}: {how}; {len(self.entries)} shard(s), {self.num_samples} samples, "
                f"{self.index.encoding} {self.index.dtype} {tuple(self.index.sample_shape)}; {check}")

    # --- integrity -----------------------------------------------------------------------------

    def _sha256_problem(self, i: int) -> str | None:
        """``None`` when shard ``i`` hashes to its index entry, else the one-line reason."""
        path, want = self.path(i), self.entries[i]["sha256"].lower()
        try:
            got = file_sha256(path)
        except FileNotFoundError:
            return f"{path}: shard file missing"
        except OSError as exc:
            return f"{path}: cannot read shard ({exc.strerror or exc})"
        return None if got == want else f"{path}: checksum mismatch (file changed or truncated)"

    def _at_open_problem(self, i: int) -> str | None:
        """The check made before shard ``i`` is opened: its non-data blocks (v3), else the whole file."""
        blk = self._blocks.get(i)
        return self._sha256_problem(i) if blk is None else blk.check(blk.at_open())

    def _full_problem(self, i: int) -> str | None:
        """The whole file's SHA-256 and, where the index has them, every block's, in one read."""
        blocks = self.entries[i].get("blocks")
        if blocks is None:
            return self._sha256_problem(i)
        path, check = self.path(i), BlockCheck(self.path(i), blocks)
        problem = check.size_problem()
        if problem:
            return problem
        try:
            whole, got = file_digests(path, check.block_bytes, check.digest, check.grid.origin)
        except OSError as exc:
            return f"{path}: cannot read shard ({exc.strerror or exc})"
        bad = next((p for p in map(check.problem, range(len(got)), map(bytes.fromhex, got)) if p), None)
        return bad or (None if whole == self.entries[i]["sha256"].lower() else
                       f"{path}: checksum mismatch (file changed or truncated)")

    def _first_problem(self, shards: list[int], threads: int, check=None) -> tuple[int, str] | None:
        """Check ``shards`` (``threads`` at once: hashlib and reads release the GIL); the lowest bad one."""
        check = check or self._at_open_problem
        t0 = time.perf_counter()
        if threads > 1 and len(shards) > 1:
            with ThreadPoolExecutor(min(threads, len(shards)), thread_name_prefix="hpctrain-sha256") as pool:
                found = list(pool.map(check, shards))
        else:
            found = [check(i) for i in shards]
        self.verify_s += time.perf_counter() - t0
        return next(((i, p) for i, p in zip(shards, found) if p), None)

    def _verify_collective(self) -> None:
        """Collective over ``comm``: each shard hashed by one rank (of the node, with ``node``), verdicts
        allgathered; every rank raises the same ShardError naming the lowest bad shard."""
        from mpi4py import MPI
        comm = self.comm
        group = comm.Split_type(MPI.COMM_TYPE_SHARED) if self.verify_mode == "node" else comm
        try:
            rank, size = group.Get_rank(), group.Get_size()
            threads = 1 if comm.Get_size() > 1 else HASH_THREADS
            problem = self._first_problem(list(range(rank, len(self.entries), size)), threads)
        except Exception as exc:          # never leave the other ranks waiting in the allgather
            problem = (-1, f"{self.index.directory}: checksum pass failed on rank {comm.Get_rank()}: {exc}")
        finally:
            if group is not comm:
                group.Free()
        problems = [p for p in comm.allgather(problem) if p]
        if problems:
            raise ShardError(min(problems)[1])
        self.verify_ranks = size
        self.verified.update(range(len(self.entries)))
        for blk in self._blocks.values():           # checked by another rank: agreed above
            blk.mark_done(blk.at_open())

    def mark_verified(self, shards) -> None:
        """Trust ``shards`` as checked by another process reading the same files (the node reader)."""
        self.verified.update(int(i) for i in shards)

    def _open(self, i: int) -> h5py.File:
        if i in self._files:
            return self._files[i]
        entry, path = self.entries[i], self.path(i)
        if self.verify_mode != "off" and i not in self.verified:
            problem = self._first_problem([i], 1)    # without a communicator: at first open, here
            if problem:
                raise ShardError(problem[1])
            self.verified.add(i)
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
        self._datasets[i] = (fh["x"], fh["y"])       # a lookup by name opens the object anew: do it once
        if self.driver == "serial":
            self._direct_extents(i, path)
        elif i in self._blocks:
            self._stored[i] = tuple(DirectExtent.of(ds, path, -1) for ds in self._datasets[i])
        if i in self._blocks:
            self._check_unread_blocks(i)
        return fh

    def _check_unread_blocks(self, i: int) -> None:
        """Data blocks that this set will not read by ``pread`` (read through HDF5) are checked now."""
        (ex, ey), dy = self._direct.get(i) or self._stored.get(i, (None, None)), self._datasets[i][1]
        extents = [(e.offset, e.end()) for e in (ex, ey if dy.dtype == np.int64 else None) if e is not None]
        blk = self._blocks[i]
        problem = blk.check(blk.only_read_by(extents))
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
        """Read samples ``[start, stop)`` into ``x[:n]``, ``y[:n]`` (raw: straight from HDF5, no copy)."""
        for i, lo, hi, off in self._pieces(start, stop):
            self._open(i)
            dx, dy = self._datasets[i]
            ex, ey = self._direct.get(i, (None, None))
            n = hi - lo
            try:
                if ex is not None:
                    self._read_direct(i, ex, lo, hi, x[off:off + n])
                elif self.index.encoding == "jpeg":
                    x[off:off + n] = dx[lo:hi]
                elif n:
                    dx.read_direct(x, np.s_[lo:hi], np.s_[off:off + n])
                    self._check_stored(i, 0, lo, hi, x[off:off + n])
                if ey is not None and dy.dtype == np.int64:
                    self._read_direct(i, ey, lo, hi, y[off:off + n])
                else:
                    y[off:off + n] = dy[lo:hi]
                    self._check_stored(i, 1, lo, hi, y[off:off + n])
            except OSError as exc:
                raise ShardError(f"{self.path(i)}: read of samples {lo}..{hi} failed (truncated? {exc})") from None
            self._check_labels(y[off:off + n], i, lo)

    def _read_direct(self, i: int, ext: DirectExtent, lo: int, hi: int, out: np.ndarray) -> None:
        """Rows ``[lo, hi)`` by ``pread``, checking the blocks not yet checked (v3)."""
        blk = self._blocks.get(i)
        if blk is not None:
            pos, n = ext.span(lo, hi)
            if blk.read_into(ext.fd, pos, memoryview(out).cast("B")[:n], self._pool()):  # type: ignore[arg-type]  # numpy stub: buffers only on 3.12+
                return
        ext.read_into(lo, hi, out)

    def _pool(self) -> ThreadPoolExecutor | None:
        if self._hash_pool is None and HASH_THREADS > 1:
            self._hash_pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="hpctrain-block")
        return self._hash_pool

    def _check_stored(self, i: int, which: int, lo: int, hi: int, out: np.ndarray) -> None:
        """After HDF5 read rows ``[lo, hi)`` of a dataset stored as read (``mpio``): check the blocks
        they touch; the rest of a block cut by the range is read through HDF5 too."""
        blk, ext = self._blocks.get(i), self._stored.get(i, (None, None))[which]
        ds = self._datasets[i][which]
        if blk is None or ext is None or hi <= lo or (which == 1 and ds.dtype != np.int64):
            return                  # labels stored as another integer type: their blocks were checked at open

        def read_bytes(pos: int, view: memoryview) -> None:
            r0 = (pos - ext.offset) // ext.row_bytes
            r1 = -(-(pos + len(view) - ext.offset) // ext.row_bytes)
            raw = memoryview(np.ascontiguousarray(ds[r0:r1])).cast("B")  # type: ignore[arg-type]  # numpy stub: buffers only on 3.12+
            skip = pos - ext.offset - r0 * ext.row_bytes
            view[:] = raw[skip:skip + len(view)]

        pos, n = ext.span(lo, hi)
        blk.check_read(pos, memoryview(out).cast("B")[:n], read_bytes, self._pool())  # type: ignore[arg-type]  # numpy stub: buffers only on 3.12+

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
        problem = self._first_problem(list(range(len(self.entries))), HASH_THREADS, self._full_problem)
        if problem:
            raise ShardError(problem[1])
        self.verified.update(range(len(self.entries)))
        for blk in self._blocks.values():
            blk.mark_done(range(len(blk.want)))

    def close(self) -> None:
        """Close the open files (collective with ``mpio``: every rank must call it)."""
        for i in sorted(self._files):
            self.close_one(i)
        if self._hash_pool is not None:
            self._hash_pool.shutdown()
            self._hash_pool = None


def _close_at_exit(ref) -> None:
    shards = ref()
    if shards is not None:
        shards.close()
