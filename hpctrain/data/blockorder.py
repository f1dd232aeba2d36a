"""An epoch's order of the blocks: which block sits at each position of the permuted sequence.

Two ways, the same on every rank, seeded by ``(seed, epoch)``:

* :class:`ArrayOrder`: NumPy's ``default_rng([seed, epoch]).permutation(n_blocks)``, held whole
  (8 bytes a block). What every plan used before, so a dataset of up to
  :data:`ARRAY_MAX_BLOCKS` blocks (134 M samples in blocks of 32) plans exactly as it did: the
  same batches, and resumes of older checkpoints continue the same sequence.
* :class:`FeistelOrder`: above that, an arithmetic permutation computed on demand, O(1) memory:
  a balanced Feistel network on ``2**bits >= n_blocks`` (six rounds, a splitmix64 mix of the
  right half and a round key drawn from ``(seed, epoch)``), each output at or past ``n_blocks``
  walked again until it falls inside (cycle walking, the standard way to cut a bijection on a
  power of two down to any range; Black & Rogaway 2002). A 2·10⁹-sample dataset has 62.5 M
  blocks of 32: held whole that is 500 MB per rank and seconds of shuffling every epoch, where a
  rank needs only its own 1/size of the positions. Statistically a different shuffle from
  NumPy's (why not the same: NumPy's cannot be computed one position at a time), which is why it
  is only used where the array would not fit.

Both answer ``ids(j0, j1)`` (the blocks at positions ``j0..j1``) and ``position_of(block)``.
"""
from __future__ import annotations

import numpy as np

ARRAY_MAX_BLOCKS = 1 << 22        # 32 MiB of int64 per rank: above it, FeistelOrder
ROUNDS = 6
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


class ArrayOrder:
    """NumPy's permutation of ``n_blocks``, held whole (the plans of before, unchanged)."""

    def __init__(self, n_blocks: int, seed: int, epoch: int):
        self.perm = np.random.default_rng([seed, epoch]).permutation(n_blocks)

    def ids(self, j0: int, j1: int) -> np.ndarray:
        return self.perm[j0:j1]

    def position_of(self, block: int) -> int:
        return int(np.flatnonzero(self.perm == block)[0])


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64 arithmetic wraps: that is the point)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class FeistelOrder:
    """A seeded bijection of ``0..n_blocks-1`` computed per position (module docstring)."""

    def __init__(self, n_blocks: int, seed: int, epoch: int):
        self.n = n_blocks
        bits = max(2, int(n_blocks - 1).bit_length())
        self.half = np.uint64((bits + 1) // 2)
        self.mask = np.uint64((1 << int(self.half)) - 1)
        self.keys = np.random.default_rng([seed, epoch]).integers(0, 2**63, size=ROUNDS, dtype=np.uint64)

    def _round(self, r: np.ndarray, key: np.uint64) -> np.ndarray:
        return _mix(r ^ key) & self.mask

    def _forward(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            left, right = right, left ^ self._round(right, k)
        return (left << self.half) | right

    def _backward(self, y: np.ndarray) -> np.ndarray:
        left, right = y >> self.half, y & self.mask
        for k in self.keys[::-1]:
            left, right = right ^ self._round(left, k), left
        return (left << self.half) | right

    def _walk(self, x: np.ndarray, step) -> np.ndarray:
        y = step(x)
        out = y >= np.uint64(self.n)
        while out.any():
            y[out] = step(y[out])
            out = y >= np.uint64(self.n)
        return y

    def ids(self, j0: int, j1: int) -> np.ndarray:
        return self._walk(np.arange(j0, j1, dtype=np.uint64), self._forward).astype(np.int64)

    def position_of(self, block: int) -> int:
        return int(self._walk(np.array([block], dtype=np.uint64), self._backward)[0])


def block_order(n_blocks: int, seed: int, epoch: int) -> ArrayOrder | FeistelOrder:
    """The epoch's order: NumPy's array up to :data:`ARRAY_MAX_BLOCKS` blocks, else arithmetic."""
    cls = ArrayOrder if n_blocks <= ARRAY_MAX_BLOCKS else FeistelOrder
    return cls(n_blocks, seed, epoch)
