"""Which samples each rank reads in an epoch: pure functions, identical on every rank.

The split's index space is cut into blocks of ``block_size`` contiguous samples; the blocks are
permuted with a generator seeded by ``(seed, epoch)`` (the same on every rank;
:mod:`~hpctrain.data.blockorder`), and the permuted
sample sequence is dealt to ranks in balanced contiguous parts (:func:`block_range`, as mpi4py-fft's
``_blockdist``). Each rank therefore reads long contiguous runs — whole blocks — never single
samples, and every sample is assigned exactly once per epoch. The plan is computed lazily, a chunk
of blocks at a time (:func:`iter_rank_runs`): a rank's memory does not grow with the split
(``scripts/bench-plan``: 2·10⁹ samples plan in well under a second and 100 MB).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from hpctrain.data.blockorder import block_order

CHUNK_BLOCKS = 1 << 16     # blocks computed at once by iter_rank_runs (a few MB of arrays)


def block_range(n: int, size: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of ``rank``'s balanced share of ``n`` items over ``size`` ranks.

    The first ``n % size`` ranks get one extra item; shares are contiguous and cover ``0..n``.
    """
    q, r = divmod(n, size)
    start = rank * q + min(rank, r)
    return start, start + q + (rank < r)


SHARD_MULTIPLE = 32   # samples: the default block_size (data.block_size); any power of two up to it divides it


def shard_range(n: int, n_shards: int, i: int, multiple: int = SHARD_MULTIPLE) -> tuple[int, int]:
    """``[start, stop)`` of shard ``i`` of a split of ``n`` samples written as ``n_shards`` files.

    Balanced contiguous shares of whole ``multiple``-sample groups (the last shard also takes the
    ``n % multiple`` left over), so every shard starts at a multiple of the plan's default block
    size, and of every power of two below it: a block of the plan then lies in one file, its ends
    on boundaries of the digest grid laid on the rows, or inside one digest block
    (``index.aligned_grid``).
    Splits too small for one group per shard: :func:`block_range`, as before index v5.
    """
    if n < multiple * n_shards:
        return block_range(n, n_shards, i)
    start, stop = block_range(n // multiple, n_shards, i)
    return start * multiple, n if i == n_shards - 1 else stop * multiple


def steps_per_epoch(n_samples: int, global_batch: int, drop_last: bool = True) -> int:
    """Optimiser steps in one epoch; every rank takes the same number."""
    return n_samples // global_batch if drop_last else -(-n_samples // global_batch)


def lane_problem(lanes: int, size: int, global_batch: int) -> str | None:
    """Why ``lanes`` lanes cannot be read by ``size`` ranks at this global batch (None: they can).

    Each rank reads whole lanes (``lanes / size`` of them) and each lane gives the same share of
    every global batch (``global_batch / lanes`` samples)."""
    if lanes % size:
        return (f"{size} ranks do not divide its {lanes} lanes; run on a rank count that divides {lanes} "
                f"(the same run), or start a new run with data.lanes a multiple of {size}")
    if global_batch % lanes:
        return (f"{lanes} lanes do not divide the global batch of {global_batch} (train.batch_size); each lane "
                f"gives global_batch / lanes samples to every batch")
    return None


def permuted_blocks(n_samples: int, block_size: int, seed: int, epoch: int) -> list[tuple[int, int]]:
    """All blocks ``(start, stop)`` in this epoch's order (same on every rank). A list of every
    block: for tests and small splits; the loader's plan is :func:`iter_rank_runs`."""
    n_blocks = -(-n_samples // block_size)
    ids = block_order(n_blocks, seed, epoch).ids(0, n_blocks)
    return [(int(a), int(min(a + block_size, n_samples))) for a in ids * block_size]


def rank_runs(n_samples: int, size: int, rank: int, *, epoch: int, seed: int, block_size: int,
              total: int | None = None) -> list[tuple[int, int]]:
    """Contiguous sample runs ``(start, stop)`` that ``rank`` reads this epoch, as a list
    (:func:`iter_rank_runs`, which the loader uses, yields the same runs lazily).

    ``total`` > ``n_samples`` pads by wrapping around the permuted sequence (so every rank gets
    the same count when the last batch is kept); by default each sample appears exactly once.
    """
    return list(iter_rank_runs(n_samples, size, rank, epoch=epoch, seed=seed, block_size=block_size, total=total))


def iter_rank_runs(n_samples: int, size: int, rank: int, *, epoch: int, seed: int, block_size: int,
                   total: int | None = None, chunk_blocks: int = CHUNK_BLOCKS) -> Iterator[tuple[int, int]]:
    """:func:`rank_runs` computed ``chunk_blocks`` blocks at a time: memory O(chunk) beside the
    block order (:mod:`~hpctrain.data.blockorder`), whatever the split's size. Adjacent blocks
    merge into one run, across chunks too."""
    if n_samples <= 0 or block_size <= 0:
        return
    total = n_samples if total is None else total
    lo, hi = block_range(total, size, rank)
    if lo >= hi:
        return
    seq = _Sequence(n_samples, block_size, block_order(-(-n_samples // block_size), seed, epoch))
    pending: tuple[int, int] | None = None
    p = lo
    while p < hi:                               # one pass of the permuted sequence at a time (padding wraps)
        q = p % n_samples
        q_end = min(n_samples, q + (hi - p))
        ja, jb = seq.position_at(q), seq.position_at(q_end - 1) + 1
        for j0 in range(ja, jb, chunk_blocks):
            a, b = seq.runs(j0, min(jb, j0 + chunk_blocks), q, q_end)
            if pending is not None:
                if pending[1] == a[0]:
                    a[0] = pending[0]
                else:
                    yield pending
            yield from zip(a[:-1].tolist(), b[:-1].tolist())
            pending = (int(a[-1]), int(b[-1]))
        p += q_end - q
    if pending is not None:
        yield pending


class _Sequence:
    """The permuted sequence of one pass: position ``j`` holds block ``order.ids(j)``, all blocks
    ``block_size`` samples but the last (``last`` samples), wherever the order put it."""

    def __init__(self, n_samples: int, block_size: int, order):
        self.bs, self.order = block_size, order
        n_blocks = -(-n_samples // block_size)
        self.last_id, self.last = n_blocks - 1, n_samples - (n_blocks - 1) * block_size
        self.j_short = order.position_of(self.last_id)
        self.short_start = self.j_short * block_size          # where the short block sits in the sequence

    def position_at(self, q: int) -> int:
        """The position of the block holding sequence element ``q``."""
        if q < self.short_start:
            return q // self.bs
        if q < self.short_start + self.last:
            return self.j_short
        return self.j_short + 1 + (q - self.short_start - self.last) // self.bs

    def runs(self, j0: int, j1: int, q: int, q_end: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample runs ``[a, b)`` of positions ``j0..j1`` clipped to sequence elements ``q..q_end``,
        adjacent ones merged (at least one run)."""
        js = np.arange(j0, j1, dtype=np.int64)
        ids = self.order.ids(j0, j1)
        seq_start = js * self.bs - np.where(js > self.j_short, self.bs - self.last, 0)
        length = np.where(js == self.j_short, self.last, self.bs)
        s = np.maximum(seq_start, q)
        e = np.minimum(seq_start + length, q_end)
        a = ids * self.bs + (s - seq_start)
        b = ids * self.bs + (e - seq_start)
        joined = a[1:] == b[:-1]                   # the next block continues this one in the file
        return a[np.concatenate(([True], ~joined))], b[np.concatenate((~joined, [True]))]
