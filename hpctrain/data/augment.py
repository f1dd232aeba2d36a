"""Batched train-time augmentation and normalisation in torch, on (B, C, H, W) tensors.

* ``padcrop`` — pad by ``pad`` pixels and cut a random ``H × W`` window (the CIFAR recipe of He
  et al. 2016, §4.2). Padding happens after normalisation, so it pads with the mean colour.
* ``rrc`` — random resized crop (Szegedy et al. 2015; torchvision ``RandomResizedCrop``): a box of
  area fraction in ``scale`` and aspect ratio in ``ratio`` (log-uniform), resized back to
  ``H × W``. Done for the whole batch in one ``affine_grid``/``grid_sample`` call, with the
  horizontal flip folded into the same affine map. Unlike torchvision (10 rejection attempts,
  then a centre crop) the box sides are clamped to the image.
* ``flip`` — horizontal flip with probability 1/2.

Randomness: each batch draws from its own ``torch.Generator``, seeded by ``(seed, epoch, rank,
step)`` (:func:`generator_for`), so a batch's crops and flips are a pure function of where it is
in the run, never of how many batches were drawn before it: a run resumed part-way through an epoch
augments its batches exactly as the uninterrupted run did (one generator per epoch, restarted at
the resume point, gave batch ``k`` the draws of batch 0). Parameters are drawn on the host; the
appliers run on the batch's device (:class:`BatchPrep`: on the GPU after the copy of a raw
batch), with the same result on the CPU.
Evaluation and Final Polishing's un-augmented pass use no :class:`Augment`.
Samplers (``*_params``) and the pure appliers (``*_at``) are separate so tests can check the
appliers against an independent computation. What an applier makes on the host (indices, affine
maps, flip masks) reaches the device through :func:`host_to`: from page-locked memory, without
blocking, so a batch's augmentation queues its kernels behind the copies instead of making the
host wait for the device two or three times per batch.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

KINDS = ("auto", "padcrop", "rrc", "flip")


def host_to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device``: as it is for the CPU; otherwise copied into page-locked
    memory (a host memcpy) and from there asynchronously (``non_blocking``), ordered on the
    current stream before the kernels that use it. A pageable source would make the copy wait
    for the device; torch keeps the pinned block alive until the copy has run."""
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


class Normalize:
    """Raw samples → float32 ``(x - mean) / std`` per channel, on the device the samples are on.

    ``x`` is a NumPy array (any dtype: uint8 images, float features) or a tensor on any device (a
    uint8 batch just copied to the GPU): the conversion and the two in-place passes run where
    ``x`` is, with the same float32 operations, so the result does not depend on where it ran.
    """

    def __init__(self, normalize: dict, n_channels: int):
        self.mean = torch.tensor(normalize.get("mean", [0.0] * n_channels), dtype=torch.float32)
        self.std = torch.tensor(normalize.get("std", [1.0] * n_channels), dtype=torch.float32)
        self._on = {self.mean.device: (self.mean, self.std)}    # per-device copies, made once

    @classmethod
    def of(cls, index) -> Normalize:
        """The normalisation a shard index promises (``index.normalize``, one entry per channel)."""
        return cls(index.normalize, index.sample_shape[0] if index.sample_shape else 1)

    def __call__(self, x) -> torch.Tensor:
        t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
        t = t.float() if t.dtype != torch.float32 else t.clone()
        if t.device not in self._on:
            self._on[t.device] = (host_to(self.mean, t.device), host_to(self.std, t.device))
        mean, std = self._on[t.device]
        view = (1, -1) + (1,) * max(t.dim() - 2, 0)
        return t.sub_(mean.view(view)).div_(std.view(view))    # in place: one buffer


class BatchPrep:
    """A raw batch → the model's input, on whatever device the batch is on: :class:`Normalize`,
    then ``transform(x, gen_at(step))`` (an :class:`Augment`) when one is given.

    The one place normalisation (and augmentation) is applied: the loader's thread calls it on host
    batches; a job training on a GPU calls it after copying a raw (uint8) batch to the device, for
    training, evaluation and Final Polishing alike. Calls are the epoch's batches in order from
    ``step`` (the resume point): batch ``step`` draws its parameters on the host from its own
    generator ``gen_at(step)``, so the same batches get the same crops and flips either way, and
    whatever was drawn before.
    """
    __slots__ = ("normalize", "transform", "gen_at", "step")

    def __init__(self, normalize: Normalize, transform=None,
                 gen_at: Callable[[int], torch.Generator] | None = None, step: int = 0):
        if transform is not None and gen_at is None:
            raise ValueError("BatchPrep: a transform needs its generators")
        self.normalize, self.transform, self.gen_at, self.step = normalize, transform, gen_at, step

    def __call__(self, x) -> torch.Tensor:
        t = self.normalize(x)
        if self.transform is None or self.gen_at is None:     # (a transform always has gen_at)
            return t
        gen = self.gen_at(self.step)
        self.step += 1
        return self.transform(t, gen)


def flip_params(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, generator=gen) < 0.5


def flip_at(x: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    return torch.where(host_to(flips.view(-1, 1, 1, 1), x.device), x.flip(-1), x)


def padcrop_params(n: int, pad: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-left offsets ``(oy, ox)`` in ``0..2*pad`` of each crop in the padded image."""
    return torch.randint(0, 2 * pad + 1, (n,), generator=gen), torch.randint(0, 2 * pad + 1, (n,), generator=gen)


def padcrop_at(x: torch.Tensor, oy: torch.Tensor, ox: torch.Tensor, pad: int) -> torch.Tensor:
    """Zero-pad by ``pad`` and take each sample's ``H × W`` window at ``(oy, ox)`` (one gather)."""
    b, _, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad))
    rows = host_to((oy.view(-1, 1) + torch.arange(h)).view(b, h, 1), x.device)   # made on the host
    cols = host_to((ox.view(-1, 1) + torch.arange(w)).view(b, 1, w), x.device)
    return xp[torch.arange(b, device=x.device).view(b, 1, 1), :, rows, cols].permute(0, 3, 1, 2).contiguous()


def rrc_params(n: int, gen: torch.Generator, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> torch.Tensor:
    """Boxes ``(cx, cy, bw, bh)`` in fractions of the image (centre, width, height)."""
    area = scale[0] + (scale[1] - scale[0]) * torch.rand(n, generator=gen)
    logr = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * torch.rand(n, generator=gen)
    bw = torch.sqrt(area * torch.exp(logr)).clamp(max=1.0)
    bh = torch.sqrt(area / torch.exp(logr)).clamp(max=1.0)
    cx = bw / 2 + (1 - bw) * torch.rand(n, generator=gen)
    cy = bh / 2 + (1 - bh) * torch.rand(n, generator=gen)
    return torch.stack([cx, cy, bw, bh], 1)


def crop_resize_at(x: torch.Tensor, boxes: torch.Tensor, flips: torch.Tensor | None = None) -> torch.Tensor:
    """Resample each box of ``x`` to the full ``H × W`` (bilinear), mirrored where ``flips``."""
    b, c, h, w = x.shape
    cx, cy, bw, bh = boxes.unbind(1)
    sx = bw if flips is None else torch.where(flips, -bw, bw)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = sx, 2 * cx - 1
    theta[:, 1, 1], theta[:, 1, 2] = bh, 2 * cy - 1
    grid = F.affine_grid(host_to(theta, x.device), [b, c, h, w], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


class Augment:
    """``kind``: ``padcrop`` | ``rrc`` | ``flip`` | ``auto`` (padcrop up to 64 px, rrc above)."""

    def __init__(self, kind: str = "auto", flip: bool = True, pad: int | None = None,
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        if kind not in KINDS:
            raise ValueError(f"augmentation {kind!r}: expected one of {', '.join(KINDS)}")
        self.kind, self.flip, self.pad, self.scale, self.ratio = kind, flip, pad, scale, ratio

    def resolve(self, h: int) -> str:
        return ("padcrop" if h <= 64 else "rrc") if self.kind == "auto" else self.kind

    def __call__(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        n, h = x.shape[0], x.shape[-2]
        kind = self.resolve(h)
        flips = flip_params(n, gen) if self.flip or kind == "flip" else None
        if kind == "rrc":
            return crop_resize_at(x, rrc_params(n, gen, self.scale, self.ratio), flips)
        if kind == "padcrop":
            pad = self.pad if self.pad is not None else max(1, h // 8)
            x = padcrop_at(x, *padcrop_params(n, pad, gen), pad)
        return x if flips is None else flip_at(x, flips)

    def __repr__(self) -> str:
        return f"Augment({self.kind!r}, flip={self.flip})"


def generator_for(seed: int, epoch: int, rank: int, step: int) -> torch.Generator:
    """The augmentation stream of ``rank``'s batch ``step`` in ``epoch`` alone (offset 2 keeps it
    apart from the shuffle; see the module docstring)."""
    key = [seed, epoch, 1 + rank, 2, step]
    state = np.random.SeedSequence(key).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))
