"""Integrity of one split's shards against the index (:mod:`hpctrain.data.index`): what has been
checked, and the routes that check it. :class:`~hpctrain.data.shards.ShardSet` opens and reads;
it asks a :class:`ShardChecks` before a shard is opened and while its bytes are read.

``verify`` (default ``"shared"``): no byte of a shard is used before it has matched a digest of
the index. Two ways, by what the index holds:

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
node-local copies; ``"off"``: no hashing. A file changed on disk after its check is caught by
its size and modification time, looked at after every read (:meth:`ShardSet.read_into`): a size
other than the index's stops the job (under every driver: ``mpio`` reads zeros past the end of
a truncated file without an error), a new modification time makes this process check the file
again (:meth:`ShardChecks.changed`, even with ``"off"`` the size is checked). Labels stay
range-checked on every read, and HDF5 checks its own structures.

The routes: :meth:`ShardChecks.collective` (at construction, over a communicator),
:meth:`ShardChecks.before_open` (this process, at a shard's first open), :meth:`ShardChecks.verify_all`
(every byte now: ``data_tools verify``), and the data blocks as read (:meth:`ShardChecks.read_direct`
for ``pread``, :meth:`ShardChecks.check_stored` after an ``mpio`` read, :meth:`ShardChecks.unread_blocks`
for what neither will read).
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hpctrain.data.blocks import BlockCheck
from hpctrain.data.direct import DirectExtent
from hpctrain.data.index import DIGEST_LABELS, ShardError, file_digests, file_sha256

HASH_THREADS = max(1, min(4, os.cpu_count() or 1))   # files hashed at once by one process (no comm, 1 rank)
MISMATCH = "checksum mismatch (file changed or truncated)"


def sha256_problem(path: str, entry: dict) -> str | None:
    """``None`` when the file at ``path`` hashes to its index entry, else the one-line reason."""
    try:
        got = file_sha256(path)
    except FileNotFoundError:
        return f"{path}: shard file missing"
    except OSError as exc:
        return f"{path}: cannot read shard ({exc.strerror or exc})"
    return None if got == entry["sha256"].lower() else f"{path}: {MISMATCH}"


def full_problem(path: str, entry: dict) -> str | None:
    """The whole file's SHA-256 and, where the index has them, every block's, in one read."""
    blocks = entry.get("blocks")
    if blocks is None:
        return sha256_problem(path, entry)
    check = BlockCheck(path, blocks)
    problem = check.size_problem()
    if problem:
        return problem
    try:
        whole, got = file_digests(path, check.block_bytes, check.digest, check.grid.origin)
    except OSError as exc:
        return f"{path}: cannot read shard ({exc.strerror or exc})"
    bad = next((p for p in map(check.problem, range(len(got)), map(bytes.fromhex, got)) if p), None)
    return bad or (None if whole == entry["sha256"].lower() else f"{path}: {MISMATCH}")


class ShardChecks:
    """What this process knows to match the index, for one split: ``verified`` (shards whose
    at-open check passed, here or on another rank), ``blocks`` (the block digests checked as read,
    index v3 on), ``verify_s`` (seconds this process hashed), ``verify_ranks`` (ranks that shared
    the collective pass; 0 without one)."""

    def __init__(self, paths: list[str], entries: list[dict], mode: str, on_read: bool):
        """``mode``: one of :data:`hpctrain.data.shards.VERIFY_MODES`; ``on_read``: check data blocks as
        read where the index has block digests (raw samples read by ``pread`` or stored as read)."""
        self.paths, self.entries, self.mode = paths, entries, mode
        self.verified: set[int] = set()
        self.verify_s, self.verify_ranks = 0.0, 0
        self.blocks = {i: BlockCheck(paths[i], e["blocks"]) for i, e in enumerate(entries)
                       if on_read and mode != "off" and "blocks" in e}
        self._hash_pool: ThreadPoolExecutor | None = None

    def describe(self) -> str:
        """The integrity part of :meth:`ShardSet.describe`."""
        if self.mode == "off":
            return "checksums not checked (verify off)"
        if self.blocks:
            first = next(iter(self.blocks.values()))
            whole = len(self.entries) - len(self.blocks)
            return (f"{DIGEST_LABELS[first.digest]} of {first.block_bytes >> 10} KiB blocks: "
                    f"metadata blocks checked at open"
                    f"{f' over {self.verify_ranks} rank(s)' if self.verify_ranks else ''}, data blocks as first read"
                    f"{f'; {whole} shard(s) without block digests checked whole' if whole else ''}")
        if self.verify_ranks:
            return (f"SHA-256 of every shard checked at open, {self.mode} over {self.verify_ranks} "
                    f"rank(s) ({self.verify_s:.2f} s here)")
        return "SHA-256 of each shard checked when this process first opens it"

    # --- at open: metadata blocks (v3) or the whole file ----------------------------------------

    def _at_open_problem(self, i: int) -> str | None:
        """The check made before shard ``i`` is opened: its non-data blocks (v3), else the whole file."""
        blk = self.blocks.get(i)
        return sha256_problem(self.paths[i], self.entries[i]) if blk is None else blk.check(blk.at_open())

    def _full_problem(self, i: int) -> str | None:
        return full_problem(self.paths[i], self.entries[i])

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

    def collective(self, comm, directory: str) -> None:
        """Collective over ``comm``: each shard hashed by one rank (of the node, with ``node``), verdicts
        allgathered; every rank raises the same ShardError naming the lowest bad shard."""
        from mpi4py import MPI
        group = comm.Split_type(MPI.COMM_TYPE_SHARED) if self.mode == "node" else comm
        try:
            rank, size = group.Get_rank(), group.Get_size()
            threads = 1 if comm.Get_size() > 1 else HASH_THREADS
            problem = self._first_problem(list(range(rank, len(self.entries), size)), threads)
        except Exception as exc:          # never leave the other ranks waiting in the allgather
            problem = (-1, f"{directory}: checksum pass failed on rank {comm.Get_rank()}: {exc}")
        finally:
            if group is not comm:
                group.Free()
        problems = [p for p in comm.allgather(problem) if p]
        if problems:
            raise ShardError(min(problems)[1])
        self.verify_ranks = size
        self.verified.update(range(len(self.entries)))
        for blk in self.blocks.values():            # checked by another rank: agreed above
            blk.mark_done(blk.at_open())

    def before_open(self, i: int) -> None:
        """Without a communicator: shard ``i``'s at-open check, here, the first time it is opened."""
        if self.mode != "off" and i not in self.verified:
            problem = self._first_problem([i], 1)
            if problem:
                raise ShardError(problem[1])
            self.verified.add(i)

    def changed(self, i: int) -> str | None:
        """Shard ``i`` was modified since it was checked (its modification time moved): nothing checked
        of it is trusted; its at-open check is made again now, its data blocks again as read. The
        problem, or None."""
        self.verified.discard(i)
        blk = self.blocks.get(i)
        if blk is not None:
            blk.done[:] = False
        if self.mode == "off":
            return None
        problem = self._first_problem([i], 1)
        if problem:
            return problem[1]
        self.verified.add(i)
        return None

    def mark_verified(self, shards) -> None:
        """Trust ``shards`` as checked by another process reading the same files (the node reader)."""
        self.verified.update(int(i) for i in shards)

    def verify_all(self) -> None:
        """Every shard's SHA-256, and every block's (v3/v4), against the index now (reads every byte
        once; local, threaded)."""
        problem = self._first_problem(list(range(len(self.entries))), HASH_THREADS, self._full_problem)
        if problem:
            raise ShardError(problem[1])
        self.verified.update(range(len(self.entries)))
        for blk in self.blocks.values():
            blk.mark_done(range(len(blk.want)))

    # --- data blocks, as read ---------------------------------------------------------------------

    def unread_blocks(self, i: int, extents: list[tuple[int, int]]) -> str | None:
        """Shard ``i``'s data blocks outside ``extents`` (the byte ranges read by ``pread`` or stored
        as read), checked now: nothing will check them as read."""
        blk = self.blocks[i]
        return blk.check(blk.only_read_by(extents))

    def read_direct(self, i: int, ext: DirectExtent, lo: int, hi: int, out: np.ndarray) -> None:
        """Rows ``[lo, hi)`` of ``ext`` by ``pread`` into ``out``, checking the blocks not yet checked (v3)."""
        blk = self.blocks.get(i)
        if blk is not None:
            pos, n = ext.span(lo, hi)
            if blk.read_into(ext.fd, pos, memoryview(out).cast("B")[:n], self._pool()):  # type: ignore[arg-type]  # numpy stub: buffers only on 3.12+
                return
        ext.read_into(lo, hi, out)

    def check_stored(self, i: int, ext: DirectExtent | None, ds, lo: int, hi: int, out: np.ndarray) -> None:
        """After HDF5 read rows ``[lo, hi)`` of dataset ``ds``, stored as read at ``ext`` (``mpio``):
        check the blocks they touch; the rest of a block cut by the range is read through HDF5 too."""
        blk = self.blocks.get(i)
        if blk is None or ext is None or hi <= lo:
            return

        def read_bytes(pos: int, view: memoryview) -> None:
            r0 = (pos - ext.offset) // ext.row_bytes
            r1 = -(-(pos + len(view) - ext.offset) // ext.row_bytes)
            raw = memoryview(np.ascontiguousarray(ds[r0:r1])).cast("B")  # type: ignore[arg-type]  # numpy stub: buffers only on 3.12+
            skip = pos - ext.offset - r0 * ext.row_bytes
            view[:] = raw[skip:skip + len(view)]

        pos, n = ext.span(lo, hi)
        blk.check_read(pos, memoryview(out).cast("B")[:n], read_bytes, self._pool())  # type: ignore[arg-type]  # numpy stub: buffers only on 3.12+

    def _pool(self) -> ThreadPoolExecutor | None:
        if self._hash_pool is None and HASH_THREADS > 1:
            self._hash_pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="hpctrain-block")
        return self._hash_pool

    def close(self) -> None:
        if self._hash_pool is not None:
            self._hash_pool.shutdown()
            self._hash_pool = None
