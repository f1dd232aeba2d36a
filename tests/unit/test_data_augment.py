"""Augmentation appliers against independent NumPy/torch computations; reproducible sampling."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpctrain.data.augment import (Augment, Normalize, crop_resize_at, flip_at, generator_for, padcrop_at,
                                   padcrop_params, rrc_params)


def batch(b=5, c=3, h=8, w=6, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).normal(size=(b, c, h, w)).astype(np.float32))


def test_normalize_matches_formula():
    x = np.random.default_rng(0).integers(0, 256, (4, 3, 5, 5), dtype=np.uint8)
    norm = {"mean": [10.0, 20.0, 30.0], "std": [2.0, 4.0, 8.0]}
    want = (x.astype(np.float32) - np.array(norm["mean"], np.float32)[:, None, None]) / \
        np.array(norm["std"], np.float32)[:, None, None]
    np.testing.assert_allclose(Normalize(norm, 3)(x).numpy(), want, rtol=1e-6)
    v = np.arange(6, dtype=np.float32).reshape(3, 2)                  # non-image samples: per column
    np.testing.assert_allclose(Normalize({"mean": [1, 2], "std": [1, 2]}, 2)(v).numpy(), (v - [1, 2]) / [1, 2])


def test_padcrop_matches_numpy_slicing():
    x = batch()
    oy, ox = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([4, 0, 2, 1, 3])
    got = padcrop_at(x, oy, ox, pad=2).numpy()
    xp = np.pad(x.numpy(), ((0, 0), (0, 0), (2, 2), (2, 2)))
    for k in range(5):
        np.testing.assert_array_equal(got[k], xp[k, :, oy[k]:oy[k] + 8, ox[k]:ox[k] + 6])


def test_flip_and_identity_crop():
    x = batch()
    flips = torch.tensor([True, False, True, False, False])
    want = x.numpy().copy()
    want[flips.numpy()] = want[flips.numpy()][..., ::-1]
    np.testing.assert_array_equal(flip_at(x, flips).numpy(), want)
    full = torch.tensor([[0.5, 0.5, 1.0, 1.0]] * 5)
    np.testing.assert_allclose(crop_resize_at(x, full).numpy(), x.numpy(), atol=1e-6)
    np.testing.assert_allclose(crop_resize_at(x, full, flips).numpy(), want, atol=1e-6)


def test_crop_resize_equals_interpolate_inside():
    x = batch(b=2, h=8, w=8)
    box = torch.tensor([[0.25, 0.25, 0.5, 0.5]] * 2)                    # the top-left 4×4 quarter
    got = crop_resize_at(x, box)
    want = F.interpolate(x[:, :, :4, :4], size=(8, 8), mode="bilinear", align_corners=False)
    # inside the box both sample the same bilinear points; on its border grid_sample reads the neighbours
    np.testing.assert_allclose(got[:, :, 1:7, 1:7].numpy(), want[:, :, 1:7, 1:7].numpy(), atol=1e-5)


def test_rrc_boxes_inside_image_with_area_and_ratio():
    boxes = rrc_params(4000, torch.Generator().manual_seed(0), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
    cx, cy, bw, bh = boxes.unbind(1)
    assert (bw <= 1).all() and (bh <= 1).all() and (cx - bw / 2 >= -1e-6).all() and (cx + bw / 2 <= 1 + 1e-6).all()
    assert (cy - bh / 2 >= -1e-6).all() and (cy + bh / 2 <= 1 + 1e-6).all()
    unclamped = (bw < 1) & (bh < 1)
    area, ratio = (bw * bh)[unclamped], (bw / bh)[unclamped]
    assert area.min() >= 0.08 - 1e-6 and ratio.min() >= 3 / 4 - 1e-5 and ratio.max() <= 4 / 3 + 1e-5


@pytest.mark.parametrize("kind,h", [("padcrop", 8), ("rrc", 8), ("flip", 8), ("auto", 8), ("auto", 96)])
def test_augment_reproducible_and_random(kind, h):
    x = batch(b=16, h=h, w=h)
    aug = Augment(kind)
    a = aug(x, generator_for(0, 1, 0, 0))
    assert a.shape == x.shape and torch.equal(a, aug(x, generator_for(0, 1, 0, 0)))
    assert not torch.equal(a, aug(x, generator_for(0, 2, 0, 0)))          # another epoch: other crops
    assert not torch.equal(a, aug(x, generator_for(0, 1, 1, 0)))          # another rank: other crops
    assert Augment("auto").resolve(h) == ("padcrop" if h <= 64 else "rrc")


def test_padcrop_params_range():
    oy, ox = padcrop_params(1000, 3, torch.Generator().manual_seed(1))
    assert sorted(set(oy.tolist())) == list(range(7)) and sorted(set(ox.tolist())) == list(range(7))
    with pytest.raises(ValueError, match="augmentation 'cutout'"):
        Augment("cutout")


def test_host_made_tensors_reach_the_device_through_pinned_non_blocking_copies(monkeypatch):
    """Every tensor an applier makes on the host goes through ``host_to`` (issue 22, finding 7),
    which copies from page-locked memory without blocking; on the CPU it is the tensor itself."""
    from hpctrain.data import augment
    seen = []
    real = augment.host_to
    monkeypatch.setattr(augment, "host_to", lambda t, device: seen.append(t.shape) or real(t, device))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 16, 16)
    augment.Augment("padcrop")(x, gen)          # rows, cols, flips
    assert len(seen) == 3
    seen.clear()
    augment.Augment("rrc")(torch.randn(4, 3, 96, 96), gen)      # theta (flip folded in)
    assert len(seen) == 1
    seen.clear()
    augment.Normalize({"mean": [0.5] * 3, "std": [0.2] * 3}, 3)(x)
    assert seen == []                           # CPU: mean/std already there
    t = torch.arange(6)
    assert real(t, torch.device("cpu")) is t
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(self) or self)
    calls = []
    real_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: calls.append(k) or real_to(self, *a, **k))
    out = real(t, torch.device("meta"))         # a non-CPU device that needs no GPU
    assert out.device.type == "meta" and pinned == [t] and calls == [{"non_blocking": True}]
