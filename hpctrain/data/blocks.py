"""Per-block digests of one shard file (index v3 to v5): verify on read, not before.

The index lists the digest (XXH3-128, or SHA-256 in indexes made before v4; ``index.py``) of every
``B``-byte block of the file (on the grid :class:`~hpctrain.data.index.BlockGrid`: from byte 0 up to v4,
through the start of ``x``'s rows in v5) and which blocks lie wholly inside the contiguous storage of
``x`` or ``y`` ("data" blocks). The others — HDF5 metadata, the edges of the datasets, free space:
a few blocks per file — are checked before HDF5 parses the file (:meth:`BlockCheck.check`). A
data block is checked the first time a read touches it (:meth:`BlockCheck.read_into`): the bytes
the loader asked for go straight into its buffer with one ``pread``, as unchecked, and are hashed
there right after the copy; only the rest of a block cut by the read's ends is read on the side,
once. (Reading a run in 1 MiB or 256 KiB ``pread`` pieces, each hashed while still in the CPU's
cache, measured no cheaper than one ``pread`` then the hashes: the extra calls cost what the
warmer cache saves. With a v3/v4 grid from byte 0 the side reads cost about an eighth more bytes
copied with 4.8 MB runs and 1 MiB blocks, a sixth at 2 ranks; the v5 grid of whole rows, through
``x``'s first byte, makes the plan's runs start and end on block boundaries, so only a run cut
by a rank's share of the epoch reads aside.)
SHA-256 hashes the blocks of one read in a small thread pool (``hashlib`` releases the GIL);
XXH3 runs at several times memory-copy speed, faster than a hand-off to a thread, so its blocks
are hashed in the reading thread. A block that does not match raises a :class:`ShardError`
naming the file and the block before :meth:`read_into` returns, so no sample of it reaches a
batch.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from hpctrain.data.direct import pread_full
from hpctrain.data.index import ONE_SHOT, BlockGrid, ShardError, block_digest_name, block_hasher

THREADED = ("sha256",)   # digests slow enough to hash a read's blocks in a pool; XXH3 hashes a block in
                         # less time than handing it to a thread costs


class BlockCheck:
    """The block digests of one shard and which of them have matched in this process."""

    def __init__(self, path: str, blocks: dict):
        self.path, self.grid = path, BlockGrid.of(blocks)
        self.block_bytes, self.file_bytes = self.grid.block_bytes, self.grid.file_bytes
        self.digest = block_digest_name(blocks)
        self.want = [bytes.fromhex(h) for h in blocks[self.digest]]
        self.done = np.zeros(len(self.want), bool)
        self.data = np.zeros(len(self.want), bool)
        for a, b in blocks["data"]:
            self.data[a:b] = True

    def span(self, k: int) -> tuple[int, int]:
        return self.grid.span(k)

    def problem(self, k: int, digest: bytes) -> str | None:
        if digest == self.want[k]:
            return None
        a, b = self.span(k)
        return f"{self.path}: checksum mismatch in block {k} (bytes {a}..{b}; file changed or corrupted)"

    def size_problem(self) -> str | None:
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            return f"{self.path}: shard file missing"
        except OSError as exc:
            return f"{self.path}: cannot read shard ({exc.strerror or exc})"
        if size != self.file_bytes:
            return (f"{self.path}: checksum mismatch: file has {size} bytes, index says {self.file_bytes} "
                    f"(changed or truncated)")
        return None

    def at_open(self) -> list[int]:
        """The blocks checked before the file is parsed: all but the data blocks."""
        return [int(k) for k in np.flatnonzero(~self.data)]

    def only_read_by(self, extents) -> list[int]:
        """Data blocks outside the ``(offset, end)`` byte ranges this process reads itself (with
        ``pread``): read through HDF5 instead, they must be checked at open; unchecked ones returned."""
        inside = np.zeros(len(self.want), bool)
        for a, e in extents:
            lo, hi = self.grid.inside(a, e)
            inside[lo:hi] = True
        self.data &= inside
        return [int(k) for k in np.flatnonzero(~self.data & ~self.done)]

    def check(self, blocks) -> str | None:
        """Read and hash ``blocks`` now; the first problem, or None (then they count as done)."""
        problem = self.size_problem()
        if problem or not len(blocks):
            return problem
        buf = memoryview(bytearray(self.block_bytes))
        with open(self.path, "rb", buffering=0) as fh:
            for k in blocks:
                a, b = self.span(k)
                try:
                    pread_full(fh.fileno(), buf[:b - a], a)
                except OSError as exc:
                    return f"{self.path}: cannot read block {k} ({exc.strerror or exc})"
                h = block_hasher(self.digest)
                h.update(buf[:b - a])
                problem = self.problem(k, h.digest())
                if problem:
                    return problem
        self.done[list(blocks)] = True
        return None

    def mark_done(self, blocks) -> None:
        self.done[list(blocks)] = True

    def check_read(self, pos: int, view: memoryview, read_bytes, pool) -> None:
        """``view`` holds the file's bytes ``[pos, pos + len(view))``, just read: check the blocks
        they touch that have not matched yet, reading the rest of a block cut by the range with
        ``read_bytes(pos, view)`` (here, not in the pool: it may be an HDF5 read). Raises the first
        mismatch as a :class:`ShardError`.

        The blocks wholly inside ``view`` are hashed with one call each in one comprehension (with
        small blocks the per-block Python cost would show); only the first and the last block can
        be cut, fed in parts with the rest read into this thread's reused scratch buffer: fresh
        pages for each side read cost more than the copy (the kernel zeroes and maps them)."""
        if not len(view):
            return
        end, span = pos + len(view), self.grid.span
        first, last = self.grid.block_of(pos), self.grid.block_of(end - 1)
        pending = [int(k) for k in np.flatnonzero(~self.done[first:last + 1]) + first]
        lo, hi = first + (pos > span(first)[0]), last + (span(last)[1] <= end)   # [lo, hi): wholly inside
        inside = [k for k in pending if lo <= k < hi]
        scratch = _scratch(2 * self.block_bytes)
        parts = {k: self._cut_parts(k, pos, view, read_bytes, scratch) for k in pending if not lo <= k < hi}

        def piece(k: int) -> memoryview:
            a, b = span(k)
            return view[a - pos:b - pos]

        def one(k: int) -> str | None:
            if k not in parts:
                return self.problem(k, ONE_SHOT[self.digest](piece(k)))
            h = block_hasher(self.digest)
            for part in parts[k]:
                h.update(part)
            return self.problem(k, h.digest())

        if pool is not None and len(pending) > 1 and self.digest in THREADED:
            found = list(pool.map(one, pending))
        else:
            digest = ONE_SHOT[self.digest]
            got = [digest(piece(k)) for k in inside]
            found = [self.problem(k, g) for k, g in zip(inside, got) if g != self.want[k]]
            found += [one(k) for k in parts]
        bad = next((p for p in found if p), None)
        if bad:
            raise ShardError(bad)
        self.mark_done(pending)

    def _cut_parts(self, k: int, pos: int, view: memoryview, read_bytes, scratch: memoryview):
        """Block ``k``'s bytes as (head read here, the part in ``view``, tail read here)."""
        a, b = self.span(k)
        s, e = max(pos, a), min(pos + len(view), b)
        head, tail = scratch[:s - a], scratch[self.block_bytes:self.block_bytes + b - e]
        if len(head):
            read_bytes(a, head)
        if len(tail):
            read_bytes(e, tail)
        return head, view[s - pos:e - pos], tail

    def read_into(self, fd: int, pos: int, view: memoryview, pool) -> bool:
        """Read bytes ``[pos, pos + len(view))`` into ``view`` (one ``pread``, as unchecked) and check
        every block they touch that has not matched yet; ``False`` (nothing read) when none is left
        to check. Raises the first mismatch as a :class:`ShardError`."""
        first, last = self.grid.block_of(pos), self.grid.block_of(pos + len(view) - 1)
        if not len(view) or self.done[first:last + 1].all():
            return False
        pread_full(fd, view, pos)
        self.check_read(pos, view, lambda at, buf: pread_full(fd, buf, at), pool)
        return True


_local = threading.local()


def _scratch(n: int) -> memoryview:
    """This thread's reused buffer of at least ``n`` bytes (not zeroed; the pool's threads only
    hash parts of it, they never read into it)."""
    buf = getattr(_local, "buf", None)
    if buf is None or len(buf) < n:
        buf = _local.buf = memoryview(np.empty(n, np.uint8)).cast("B")  # type: ignore[arg-type]  # numpy stub: buffers only on 3.12+
    return buf
