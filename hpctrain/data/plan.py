"""Which samples each rank reads in an epoch: pure functions, identical on every rank.

The split's index space is cut into blocks of ``block_size`` contiguous samples; the blocks are
permuted with a generator seeded by ``(seed, epoch)`` (the same on every rank), and the permuted
sample sequence is dealt to ranks in balanced contiguous parts (:func:`block_range`, as mpi4py-fft's
``_blockdist``). Each rank therefore reads long contiguous runs — whole blocks — never single
samples, and every sample is assigned exactly once per epoch.
"""
from __future__ import annotations

import numpy as np


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


def permuted_blocks(n_samples: int, block_size: int, seed: int, epoch: int) -> list[tuple[int, int]]:
    """All blocks ``(start, stop)`` in this epoch's order (same on every rank)."""
    starts = np.arange(0, n_samples, block_size)
    order = np.random.default_rng([seed, epoch]).permutation(len(starts))
    return [(int(starts[i]), int(min(starts[i] + block_size, n_samples))) for i in order]


def rank_runs(n_samples: int, size: int, rank: int, *, epoch: int, seed: int, block_size: int,
              total: int | None = None) -> list[tuple[int, int]]:
    """Contiguous sample runs ``(start, stop)`` that ``rank`` reads this epoch.

    ``total`` > ``n_samples`` pads by wrapping around the permuted sequence (so every rank gets
    the same count when the last batch is kept); by default each sample appears exactly once.
    """
    blocks = permuted_blocks(n_samples, block_size, seed, epoch)
    total = n_samples if total is None else total
    lo, hi = block_range(total, size, rank)
    runs: list[tuple[int, int]] = []
    pos = 0                    # pos: position of the current block in the (wrapped) sequence
    while pos < hi:
        for a, b in blocks:
            n = b - a
            s, e = max(lo, pos), min(hi, pos + n)
            if s < e:
                run = (a + s - pos, a + e - pos)
                if runs and runs[-1][1] == run[0]:
                    runs[-1] = (runs[-1][0], run[1])   # merge adjacent blocks into one read
                else:
                    runs.append(run)
            pos += n
            if pos >= hi:
                break
    return runs
