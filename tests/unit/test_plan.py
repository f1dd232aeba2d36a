"""The per-epoch block plan: every sample exactly once, identical on every rank, seeded."""
import itertools

import numpy as np
import pytest

from hpctrain.data import blockorder
from hpctrain.data.blockorder import FeistelOrder
from hpctrain.data.plan import (block_range, iter_rank_runs, permuted_blocks, rank_runs, shard_range,
                                steps_per_epoch)


def covered(runs):
    return np.concatenate([np.arange(a, b) for a, b in runs]) if runs else np.empty(0, int)


@pytest.mark.parametrize("size", range(1, 10))
@pytest.mark.parametrize("n", [0, 1, 7, 100, 1437])
def test_block_range_partitions(n, size):
    ranges = [block_range(n, size, r) for r in range(size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    lengths = [b - a for a, b in ranges]
    assert max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 8, 9])
@pytest.mark.parametrize("n", [0, 5, 23, 255, 256, 1438, 7134])
def test_shard_range_cuts_at_multiples_of_32_and_stays_balanced(n, shards):
    """Every sample in one shard, in order; each shard but the last starts and ends at a multiple
    of 32, sizes differ by at most 32; too few samples for 32 per shard: the old cut."""
    cuts = [shard_range(n, shards, i) for i in range(shards)]
    assert cuts[0][0] == 0 and cuts[-1][1] == n and all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    lengths = [b - a for a, b in cuts]
    if n < 32 * shards:
        assert cuts == [block_range(n, shards, i) for i in range(shards)]
    else:
        assert all(a % 32 == 0 for a, _ in cuts) and all(b % 32 == 0 for _, b in cuts[:-1])
        assert max(lengths) - min(lengths) <= 32


@pytest.mark.parametrize("size", range(1, 10))
@pytest.mark.parametrize("n,block", [(1437, 32), (100, 7), (5, 16), (64, 1)])
def test_every_sample_exactly_once(n, block, size):
    all_idx = np.concatenate([covered(rank_runs(n, size, r, epoch=3, seed=11, block_size=block))
                              for r in range(size)])
    assert sorted(all_idx.tolist()) == list(range(n))


def test_runs_are_long_and_contiguous():
    runs = rank_runs(10_000, 4, 1, epoch=0, seed=0, block_size=256)
    # whole blocks (merged when adjacent): at most one partial block at each end of the share
    assert sum(b - a for a, b in runs) == 2500
    assert sum(1 for a, b in runs if b - a < 256) <= 2 + sum(1 for a, b in runs if b == 10_000)


def test_seeded_order():
    a = rank_runs(1000, 3, 0, epoch=1, seed=5, block_size=10)
    assert a == rank_runs(1000, 3, 0, epoch=1, seed=5, block_size=10)
    assert a != rank_runs(1000, 3, 0, epoch=2, seed=5, block_size=10)
    assert a != rank_runs(1000, 3, 0, epoch=1, seed=6, block_size=10)


@pytest.mark.parametrize("size", [1, 3, 4])
def test_padding_wraps_to_equal_counts(size):
    n, gb = 100, 24
    total = steps_per_epoch(n, gb, drop_last=False) * gb
    counts = [len(covered(rank_runs(n, size, r, epoch=0, seed=0, block_size=8, total=total))) for r in range(size)]
    assert counts == [total // size] * size
    union = np.concatenate([covered(rank_runs(n, size, r, epoch=0, seed=0, block_size=8, total=total))
                            for r in range(size)])
    assert set(union.tolist()) == set(range(n))


def test_steps_per_epoch():
    assert steps_per_epoch(1437, 64) == 22
    assert steps_per_epoch(1437, 64, drop_last=False) == 23
    assert sorted(b - a for a, b in permuted_blocks(10, 4, 0, 0)) == [2, 4, 4]


# --- the lazy plan (issue 37, item 4) ------------------------------------------------------------

def reference_runs(n, size, rank, *, epoch, seed, block_size, total=None):
    """The plan as it was before issue 37: NumPy's permutation, a list of every block, one walk."""
    starts = np.arange(0, n, block_size)
    order = np.random.default_rng([seed, epoch]).permutation(len(starts))
    blocks = [(int(starts[i]), int(min(starts[i] + block_size, n))) for i in order]
    lo, hi = block_range(n if total is None else total, size, rank)
    runs, pos = [], 0
    while pos < hi:
        for a, b in blocks:
            s, e = max(lo, pos), min(hi, pos + b - a)
            if s < e:
                run = (a + s - pos, a + e - pos)
                if runs and runs[-1][1] == run[0]:
                    runs[-1] = (runs[-1][0], run[1])
                else:
                    runs.append(run)
            pos += b - a
            if pos >= hi:
                break
    return runs


@pytest.mark.parametrize("chunk", [1, 3, 1 << 16])
@pytest.mark.parametrize("n,block,size,extra", [(1437, 32, 3, 0), (1437, 32, 3, 500), (100, 7, 4, 0),
                                                 (5, 16, 2, 3), (64, 1, 1, 0), (5000, 256, 5, 2000)])
def test_lazy_plan_is_todays_plan(n, block, size, extra, chunk):
    """Existing data plans exactly as before (same batches, resumes continue the same sequence),
    whatever the chunk the lazy plan computes at a time."""
    total = n + extra if extra else None
    for r in range(size):
        want = reference_runs(n, size, r, epoch=2, seed=7, block_size=block, total=total)
        assert list(iter_rank_runs(n, size, r, epoch=2, seed=7, block_size=block, total=total,
                                   chunk_blocks=chunk)) == want


@pytest.mark.parametrize("n_blocks", [1, 2, 3, 17, 1000, 4097])
def test_feistel_order_is_a_seeded_bijection(n_blocks):
    order = FeistelOrder(n_blocks, seed=3, epoch=1)
    ids = order.ids(0, n_blocks)
    assert sorted(ids.tolist()) == list(range(n_blocks))
    assert all(ids[order.position_of(b)] == b for b in range(0, n_blocks, max(1, n_blocks // 9)))
    if n_blocks > 100:
        assert not np.array_equal(ids, FeistelOrder(n_blocks, seed=3, epoch=2).ids(0, n_blocks))
        assert np.mean(np.abs(np.diff(ids))) > n_blocks / 10           # shuffled, not near the identity


@pytest.mark.parametrize("n,block,size", [(1437, 32, 3), (10007, 8, 5), (100, 7, 4)])
def test_arithmetic_plan_covers_every_sample_once(monkeypatch, n, block, size):
    monkeypatch.setattr(blockorder, "ARRAY_MAX_BLOCKS", 0)        # the order used above 4 M blocks
    assert sorted(covered(sum((rank_runs(n, size, r, epoch=1, seed=2, block_size=block)
                               for r in range(size)), [])).tolist()) == list(range(n))


def test_two_billion_samples_plan_in_o_blocks_memory():
    """Issue 37: 2e9 samples in blocks of 32 (62.5 M blocks) took gigabytes as a list; a rank's
    share of 2048 now plans in well under a second (seconds allowed here: a loaded CI host) and
    a few MB; a single rank streams its plan without holding it."""
    import time
    import tracemalloc
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        runs = rank_runs(2 * 10**9, 2048, 7, epoch=0, seed=0, block_size=32)
        secs = time.perf_counter() - t0
        share = sum(b - a for a, b in runs)
        first = list(itertools.islice(iter_rank_runs(2 * 10**9, 1, 0, epoch=0, seed=0, block_size=32), 1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert share == block_range(2 * 10**9, 2048, 7)[1] - block_range(2 * 10**9, 2048, 7)[0]
    assert len(first) == 1000 and secs < 5 and peak < 100e6, (secs, peak)
