"""The loader over N simulated ranks: each sample once per epoch, seeded order, augmentation off/on."""
import numpy as np
import pytest
import torch

from hpctrain.data_tools.sources import from_arrays
from hpctrain.data_tools.writer import convert
from hpctrain.data import ShardLoader, ShardSet, read_index
from hpctrain.data.augment import Augment
from hpctrain.data.index import write_index
from hpctrain.data.shardwriter import write_shard

N = 211


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """211 samples in 5 shards of 13, 77, 40, 1, 80; each sample's value is its index."""
    d = str(tmp_path_factory.mktemp("uneven"))
    x = np.arange(N, dtype=np.int32).reshape(N, 1)
    bounds = np.cumsum([0, 13, 77, 40, 1, 80])
    entries = [write_shard(d, "train", i, 5, x[a:b], np.arange(a, b) % 3)
               for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    write_index(d, {"sample_shape": [1], "dtype": "int32", "num_classes": 3, "class_names": list("abc"),
                    "normalize": {"mean": [0.0], "std": [1.0]}, "splits": {"train": {"num_samples": N, "shards": entries}}})
    return d


def sample_ids(loader, epoch, **kw):
    norm = loader.shards.index.normalize
    out = []
    for x, _ in loader.epoch(epoch, **kw):
        v = x[:, 0].double() * norm["std"][0] + norm["mean"][0]
        out.append(torch.round(v).long().tolist())
    return out


def loaders(d, size, **kw):
    s = ShardSet(read_index(d), "train")
    return [ShardLoader(s, rank=r, size=size, **kw) for r in range(size)]


@pytest.mark.parametrize("size", range(1, 10))
@pytest.mark.parametrize("drop_last", [True, False])
def test_each_sample_once_per_epoch(uneven, size, drop_last):
    ls = loaders(uneven, size, batch_size=4, block_size=7, shuffle_window=20, prefetch=0, drop_last=drop_last)
    per_rank = [sum(sample_ids(ld, 3), []) for ld in ls]
    steps = ls[0].steps
    assert all(len(p) == steps * 4 for p in per_rank)             # every rank takes the same steps
    seen = np.concatenate(per_rank)
    counts = np.bincount(seen, minlength=N)
    gb = 4 * size
    if drop_last:
        assert steps == N // gb and counts.max() == 1 and counts.sum() == steps * gb
    else:
        assert steps == -(-N // gb) and counts.min() >= 1          # all seen; wrap-around pads the rest
        assert counts.sum() == steps * gb and (counts == 2).sum() == steps * gb - N


def test_full_epoch_coverage_when_batch_divides(uneven):
    # one rank, batch 1, prefetch on: the epoch is a permutation of all 211 samples
    ls = loaders(uneven, 1, batch_size=1, block_size=16, shuffle_window=64, prefetch=2)
    assert sorted(sum(sample_ids(ls[0], 0), [])) == list(range(N))


def test_epochs_differ_and_seed_repeats(uneven):
    a = loaders(uneven, 3, batch_size=5, seed=1, block_size=8, shuffle_window=32)[1]
    b = loaders(uneven, 3, batch_size=5, seed=1, block_size=8, shuffle_window=32)[1]
    c = loaders(uneven, 3, batch_size=5, seed=2, block_size=8, shuffle_window=32)[1]
    e0, e1 = sample_ids(a, 0), sample_ids(a, 1)
    assert e0 != e1 and e0 == sample_ids(b, 0) and e0 != sample_ids(c, 0)


def test_window_shuffle_mixes_blocks(uneven):
    ld = loaders(uneven, 1, batch_size=8, block_size=8, shuffle_window=64, prefetch=0)[0]
    first = sample_ids(ld, 0)[0]
    # without the window shuffle a batch would be one block: 8 consecutive indices
    assert max(first) - min(first) > 8


def test_augment_switch_and_transform_seeded(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (64, 3, 8, 8), dtype=np.uint8)
    convert(from_arrays({"train": (x, np.zeros(64, np.int64))}, ["a"], "t"), str(tmp_path), 2)
    s = ShardSet(read_index(str(tmp_path)), "train")
    kw = dict(rank=0, size=1, batch_size=16, block_size=4, shuffle_window=32)
    aug = ShardLoader(s, transform=Augment("padcrop"), **kw)
    plain = ShardLoader(s, **kw)
    a, b = list(aug.epoch(0)), list(plain.epoch(0))
    off = list(aug.epoch(0, augment=False))
    assert all(torch.equal(p[0], q[0]) for p, q in zip(off, b))        # augment=False: the plain batches
    assert all(torch.equal(p[1], q[1]) for p, q in zip(a, b))          # same samples, same order
    assert not any(torch.equal(p[0], q[0]) for p, q in zip(a, b))      # but transformed
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, aug.epoch(0)))   # reproducibly


def test_abandoned_epoch_and_stats(uneven):
    ld = loaders(uneven, 1, batch_size=4, block_size=7, shuffle_window=20, prefetch=2)[0]
    it = ld.epoch(0)
    next(it)                                          # leave the thread blocked on a full queue
    assert len(list(ld.epoch(1))) == ld.steps         # a new epoch replaces it
    ld.close()
    assert ld.stats.batches >= ld.steps + 1 and ld.stats.wait_s >= 0 and ld.stats.read_s > 0
    assert "per-rank reading" in ld.describe() and "augment off" in ld.describe()


def test_errors_reach_the_training_thread(uneven, tmp_path):
    import shutil
    d = str(tmp_path / "copy")
    shutil.copytree(uneven, d)
    ld = ShardLoader(ShardSet(read_index(d), "train"), rank=0, size=1, batch_size=4, prefetch=2)
    import os
    os.remove(os.path.join(d, "train-00003-of-00005.h5"))
    from hpctrain.data import ShardError
    with pytest.raises(ShardError, match="train-00003-of-00005.h5: shard file missing"):
        list(ld.epoch(0))


def test_thread_running_ahead_into_next_epoch_changes_nothing(uneven):
    kw = dict(batch_size=4, block_size=7, shuffle_window=20, seed=3, transform=Augment("flip"))
    sync = loaders(uneven, 2, prefetch=0, **kw)[1]
    ahead = loaders(uneven, 2, prefetch=3, **kw)[1]
    for epoch, augment in ((0, True), (1, True), (2, False), (3, False), (4, True)):
        want, got = list(sync.epoch(epoch, augment=augment)), list(ahead.epoch(epoch, augment=augment))
        assert len(got) == len(want) == sync.steps
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(want, got))
    ahead.close()


def test_jpeg_shards_decoded_in_the_loader(tmp_path):
    from hpctrain.data.augment import Normalize
    from hpctrain.data.images import decode_batch
    rng = np.random.default_rng(0)
    x = np.repeat(rng.integers(0, 256, (24, 3, 1, 1), dtype=np.uint8), 16, 2).repeat(16, 3)   # flat colours
    convert(from_arrays({"train": (x, np.arange(24) % 2)}, ["a", "b"], "t", encode="jpeg"), str(tmp_path), 2)
    s = ShardSet(read_index(str(tmp_path)), "train")
    ld = ShardLoader(s, rank=0, size=1, batch_size=6, block_size=4, shuffle_window=12)
    raw = list(ld.raw_batches(0))
    got = list(ld.epoch(0))
    norm = Normalize(s.index.normalize, 3)
    for (blobs, y), (t, ty) in zip(raw, got):
        assert blobs.dtype == object and t.shape == (6, 3, 16, 16)
        assert torch.equal(t, norm(decode_batch(blobs, (3, 16, 16)))) and torch.equal(ty, torch.from_numpy(y))
    assert ld.stats.decode_s > 0
    ld.close()
