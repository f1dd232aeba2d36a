"""Raw batches prepared after the copy (the GPU's data path) == batches prepared in the loader.

On the CPU both paths run the same float32 operations on the same bytes, so the batches must be
bit-identical (torch.equal, no tolerance): training, evaluation and Final Polishing see the same
inputs whichever side normalises and augments.
"""
import functools

import numpy as np
import pytest
import torch

from hpctrain.data_tools.sources import from_arrays
from hpctrain.data_tools.writer import convert
from hpctrain.data import BatchPrep, Normalize, ShardLoader, ShardSet, eval_batches, eval_prep, read_index
from hpctrain.data import loader as loader_mod
from hpctrain.data.augment import Augment, generator_for


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """uint8 (3, 12, 12) images in train and test splits, normalised by their own statistics."""
    d = str(tmp_path_factory.mktemp("u8"))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (96, 3, 12, 12), dtype=np.uint8)
    convert(from_arrays({"train": (x[:80], np.arange(80) % 4), "test": (x[80:], np.arange(16) % 4)},
                        list("abcd"), "t"), d, 2)
    return d


def pair(d, transform=None, **kw):
    s = ShardSet(read_index(d), "train")
    kw = dict(rank=0, size=1, batch_size=8, block_size=4, shuffle_window=32, seed=5, transform=transform, **kw)
    return ShardLoader(s, **kw), ShardLoader(s, raw=True, **kw)


def prepared(loader, epoch, skip=0, augment=True):
    """The consumer's side, as the job does it: the epoch's prep on each (copied) batch."""
    prep = loader.batch_prep(epoch, augment, skip)
    return [(prep(x), y) for x, y in loader.epoch(epoch, skip=skip, augment=augment)]


def assert_same(want, got):
    assert len(want) == len(got) > 0
    for (x1, y1), (x2, y2) in zip(want, got):
        assert x1.dtype == x2.dtype == torch.float32
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


@pytest.mark.parametrize("kind", [None, "padcrop", "rrc", "flip"])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_raw_batches_prepared_after_the_copy_equal_the_loaders(images, kind, prefetch):
    host, raw = pair(images, Augment(kind) if kind else None, prefetch=prefetch)
    for epoch, augment in ((0, True), (1, True), (2, False)):
        batches = list(raw.epoch(epoch, augment=augment))
        assert all(x.dtype == torch.uint8 and not x.is_pinned() for x, _ in batches)   # a quarter of fp32's bytes
        assert_same(prepared(host, epoch, augment=augment), prepared(raw, epoch, augment=augment))
    host.close(), raw.close()


def test_host_loader_needs_no_prep_and_resumes_like_raw(images):
    host, raw = pair(images, Augment("padcrop"), prefetch=2)
    x = torch.zeros(2)
    assert host.batch_prep(0)(x) is x                           # the thread has done it
    assert_same(list(host.epoch(3, skip=4)), prepared(raw, 3, skip=4))
    assert "raw uint8 batches, normalised on the device" in raw.describe()
    assert "normalised on the device" not in host.describe()
    host.close(), raw.close()


def test_eval_batches_raw_then_eval_prep_equal_eval_batches(images):
    s = ShardSet(read_index(images), "test")
    want = list(eval_batches(s, rank=1, size=2, batch_size=5))
    raw = list(eval_batches(s, rank=1, size=2, batch_size=5, raw=True))
    assert all(x.dtype == torch.uint8 for x, _ in raw)
    prep = eval_prep(s)
    assert_same(want, [(prep(x), y) for x, y in raw])


def test_normalize_of_a_tensor_equals_normalize_of_its_array():
    x = np.random.default_rng(1).integers(0, 256, (4, 3, 5, 5), dtype=np.uint8)
    norm = Normalize({"mean": [10.0, 20.0, 30.0], "std": [2.0, 4.0, 8.0]}, 3)
    t = torch.from_numpy(x.copy())
    assert torch.equal(norm(x), norm(t)) and torch.equal(t, torch.from_numpy(x))   # input untouched
    f = torch.from_numpy(x.astype(np.float32))
    assert torch.equal(norm(f), norm(x)) and torch.equal(f, torch.from_numpy(x.astype(np.float32)))


def test_batch_prep_augments_each_batch_with_its_own_generator():
    x = np.random.default_rng(2).integers(0, 256, (6, 3, 8, 8), dtype=np.uint8)
    norm, aug = Normalize({}, 3), Augment("padcrop")
    prep = BatchPrep(norm, aug, functools.partial(generator_for, 0, 1, 0), step=3)
    for step in (3, 4):                                          # calls are batches 3, 4, … in order
        assert torch.equal(prep(x), aug(norm(x), generator_for(0, 1, 0, step)))
    assert not torch.equal(aug(norm(x), generator_for(0, 1, 0, 3)), aug(norm(x), generator_for(0, 1, 0, 4)))
    with pytest.raises(ValueError, match="generator"):
        BatchPrep(norm, aug)


@pytest.mark.parametrize("kind", ["padcrop", "rrc", "flip"])
@pytest.mark.parametrize("raw_side", [False, True])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_batch_is_augmented_alike_whether_or_not_earlier_batches_were_drawn(images, kind, raw_side, prefetch):
    """Resuming at batch k (``skip=k``: batches 0..k-1 never drawn) gives batches k.. exactly as
    the whole epoch does: augmentation is a function of (seed, epoch, rank, step), not of history
    (a generator per epoch, restarted at the resume point, gave batch k the crops of batch 0)."""
    loader = pair(images, Augment(kind), prefetch=prefetch)[raw_side]
    whole = prepared(loader, 2)
    for k in (1, 4):
        assert_same(whole[k:], prepared(loader, 2, skip=k))
    loader.close()


def test_raw_batches_are_pinned_only_when_cuda_is_available(images, monkeypatch):
    pinned = []

    def fake_pin(self):                      # the CPU wheel cannot pin: record and copy
        pinned.append(self.dtype)
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    _, raw = pair(images, prefetch=0)
    assert not raw.pin and list(raw.epoch(0)) and not pinned
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    host, raw = pair(images, prefetch=0)
    assert raw.pin and not host.pin
    n = len(list(raw.epoch(0)))
    assert pinned == [torch.uint8, torch.int64] * n                # x and y of every batch
    assert "(pinned)" in raw.describe()
    pinned.clear()
    list(eval_batches(ShardSet(read_index(images), "test"), rank=0, size=1, batch_size=8, raw=True))
    assert pinned == [torch.uint8, torch.int64] * 2
    assert loader_mod.host_tensor(np.zeros(3, np.uint8), pin=False).dtype == torch.uint8
