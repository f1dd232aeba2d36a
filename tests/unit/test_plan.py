"""The per-epoch block plan: every sample exactly once, identical on every rank, seeded."""
import numpy as np
import pytest

from hpctrain.data.plan import block_range, permuted_blocks, rank_runs, shard_range, steps_per_epoch


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
