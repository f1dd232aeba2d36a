"""The shard files' digests: the whole file's SHA-256 and the per-block digests on their grid.

A shard entry of the index (:mod:`index`, versions 3 to 5) holds the digest of every block of its
file; :class:`BlockGrid` says where the blocks lie, :func:`file_digests` computes them in one read
(the writer), and the checks (``shard_checks.py``, ``blocks.py``) hash blocks as they are read.
Blocks default to XXH3-128: it finds flipped bits, torn writes and truncation as surely as
SHA-256 at several times its speed; the whole file's SHA-256 is the defence against forgery.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import xxhash

BLOCK_BYTES = 1 << 20          # per-block digests: about 1 MiB (≈ 35 bytes of index per MiB of data with XXH3-128)
BLOCK_DIGESTS = {"xxh3_128": 32, "sha256": 64}   # a block digest's name in the index: its hex digits
BLOCK_DIGEST = "xxh3_128"      # what the writer makes (the module docstring says why)
DIGEST_LABELS = {"xxh3_128": "XXH3-128", "sha256": "SHA-256"}


def file_sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def block_hasher(name: str) -> Any:
    """A new incremental hasher (``update``, ``digest``, ``hexdigest``) of block digest ``name``."""
    return xxhash.xxh3_128() if name == "xxh3_128" else hashlib.new(name)


# Each digest of a whole bytes-like block in one call (no hasher object per block).
ONE_SHOT = {"xxh3_128": xxhash.xxh3_128_digest, "sha256": lambda data: hashlib.sha256(data).digest()}


def block_digest_name(blocks: dict) -> str:
    """Which of :data:`BLOCK_DIGESTS` a checked ``blocks`` object holds."""
    return next(k for k in BLOCK_DIGESTS if k in blocks)


@dataclass(frozen=True)
class BlockGrid:
    """Where the digest blocks of one file lie: block k is bytes ``[max(0, origin + k*B),
    min(S, origin + (k+1)*B))``, ``B`` = ``block_bytes`` (the index's ``bytes``), ``S`` =
    ``file_bytes``, ``-B < origin <= 0`` (index v5; 0 before). All block arithmetic of the checks
    and the writer is here."""
    block_bytes: int
    file_bytes: int
    origin: int = 0

    @classmethod
    def of(cls, blocks: dict) -> BlockGrid:
        return cls(int(blocks["bytes"]), int(blocks["file_bytes"]), int(blocks.get("origin", 0)))

    @property
    def count(self) -> int:
        return -(-(self.file_bytes - self.origin) // self.block_bytes)

    def block_of(self, pos: int) -> int:
        """The block holding byte ``pos``."""
        return (pos - self.origin) // self.block_bytes

    def span(self, k: int) -> tuple[int, int]:
        a = self.origin + k * self.block_bytes
        return max(0, a), min(a + self.block_bytes, self.file_bytes)

    def inside(self, a: int, e: int) -> tuple[int, int]:
        """``[lo, hi)``: the blocks lying wholly inside bytes ``[a, e)`` (``lo >= hi``: none)."""
        return -(-(a - self.origin) // self.block_bytes), (e - self.origin) // self.block_bytes


def aligned_grid(block_bytes: int, file_bytes: int, start: int | None = None, row_bytes: int = 0) -> BlockGrid:
    """The writer's grid: with fixed-size rows stored from byte ``start`` (raw samples), blocks of
    the power-of-two number of rows nearest ``block_bytes``, the grid passing through ``start``: a
    loader run of a power-of-two number of samples then starts and ends on block boundaries (or
    lies inside one block), so the first epoch's check reads nothing on the side. Else plain
    ``block_bytes`` blocks from byte 0."""
    if start is None or row_bytes <= 0:
        return BlockGrid(block_bytes, file_bytes)
    rows = 2 ** max(0, round(math.log2(block_bytes / row_bytes)))
    b = rows * row_bytes
    return BlockGrid(b, file_bytes, start % b - b if start % b else 0)


def file_digests(path: str, block_bytes: int, digest: str = BLOCK_DIGEST, origin: int = 0) -> tuple[str, list[str]]:
    """The file's SHA-256 and the ``digest`` of each block of the grid ``block_bytes``, ``origin``
    (:class:`BlockGrid`), in one read."""
    whole, blocks = hashlib.sha256(), []
    buf = memoryview(bytearray(block_bytes))
    want = block_bytes + origin if origin else block_bytes     # the first block is short with an origin
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf[:want])
            if not n:
                break
            while n < want:                    # a short read before the end (pipes, network FS)
                more = fh.readinto(buf[n:want])
                if not more:
                    break
                n += more
            whole.update(buf[:n])
            h = block_hasher(digest)
            h.update(buf[:n])
            blocks.append(h.hexdigest())
            want = block_bytes
    return whole.hexdigest(), blocks


def data_block_ranges(extents, grid: BlockGrid) -> list[list[int]]:
    """``[a, b)`` block ranges of ``grid`` lying wholly inside the byte extents ``(offset, n_bytes)``."""
    out = []
    for offset, n in sorted(extents):
        a, b = grid.inside(offset, offset + n)
        if a < b:
            out.append([a, b])
    return out
