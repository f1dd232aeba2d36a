"""Batched train-time augmentation and normalisation in torch, on (B, C, H, W) tensors.

* ``padcrop`` — pad by ``pad`` pixels and cut a random ``H × W`` window (the CIFAR recipe of He
  et al. 2016, §4.2). Padding happens after normalisation, so it pads with the mean colour.
* ``rrc`` — random resized crop (Szegedy et al. 2015; torchvision ``RandomResizedCrop``): a box of
  area fraction in ``scale`` and aspect ratio in ``ratio`` (log-uniform), resized back to
  ``H × W``. Done for the whole batch in one ``affine_grid``/``grid_sample`` call, with the
  horizontal flip folded into the same affine map. Unlike torchvision (10 rejection attempts,
  then a centre crop) the box sides are clamped to the image.
* ``flip`` — horizontal flip with probability 1/2.

Randomness: in training every sample draws its own uniforms, a pure function of ``(seed, epoch,
global position)`` (:class:`PositionDraws`; the position is the sample's place in the epoch's
sequence of global batches), never of the rank that holds it, the batch it was cut into, or how
many batches were drawn before it: a run resumed part-way through an epoch, or at another rank
count that deals the same global batches, augments each sample exactly as the uninterrupted run
did. A ``torch.Generator`` (:func:`generator_for`) serves too, drawing the same columns batch-wise.
Parameters are drawn on the host; the
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

from hpctrain.data.blockorder import _mix

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
                 gen_at: Callable[[int], torch.Generator | PositionDraws] | None = None, step: int = 0):
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


DRAWS = 5          # uniforms per sample: the flip, then two (padcrop offsets) or four (rrc box)


def uniforms(source, n: int) -> torch.Tensor:
    """``(n, DRAWS)`` float64 uniforms in [0, 1): from a :class:`PositionDraws` (per sample) or a
    ``torch.Generator`` (per batch)."""
    if isinstance(source, PositionDraws):
        return source.uniforms(n)
    return torch.rand(n, DRAWS, generator=source, dtype=torch.float64)


def flip_params(n: int, gen, u: torch.Tensor | None = None) -> torch.Tensor:
    u = uniforms(gen, n) if u is None else u
    return u[:, 0] < 0.5


def flip_at(x: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    return torch.where(host_to(flips.view(-1, 1, 1, 1), x.device), x.flip(-1), x)


def padcrop_params(n: int, pad: int, gen, u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-left offsets ``(oy, ox)`` in ``0..2*pad`` of each crop in the padded image."""
    u = uniforms(gen, n) if u is None else u
    return (u[:, 1] * (2 * pad + 1)).long(), (u[:, 2] * (2 * pad + 1)).long()


def padcrop_at(x: torch.Tensor, oy: torch.Tensor, ox: torch.Tensor, pad: int) -> torch.Tensor:
    """Zero-pad by ``pad`` and take each sample's ``H × W`` window at ``(oy, ox)`` (one gather)."""
    b, _, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad))
    rows = host_to((oy.view(-1, 1) + torch.arange(h)).view(b, h, 1), x.device)   # made on the host
    cols = host_to((ox.view(-1, 1) + torch.arange(w)).view(b, 1, w), x.device)
    return xp[torch.arange(b, device=x.device).view(b, 1, 1), :, rows, cols].permute(0, 3, 1, 2).contiguous()


def rrc_params(n: int, gen, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), u: torch.Tensor | None = None) -> torch.Tensor:
    """Boxes ``(cx, cy, bw, bh)`` in fractions of the image (centre, width, height)."""
    u = (uniforms(gen, n) if u is None else u).float()
    area = scale[0] + (scale[1] - scale[0]) * u[:, 1]
    logr = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[:, 2]
    bw = torch.sqrt(area * torch.exp(logr)).clamp(max=1.0)
    bh = torch.sqrt(area / torch.exp(logr)).clamp(max=1.0)
    cx = bw / 2 + (1 - bw) * u[:, 3]
    cy = bh / 2 + (1 - bh) * u[:, 4]
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

    def __call__(self, x: torch.Tensor, gen) -> torch.Tensor:
        """``gen``: a :class:`PositionDraws` (each sample its own draws) or a ``torch.Generator``."""
        n, h = x.shape[0], x.shape[-2]
        kind = self.resolve(h)
        u = uniforms(gen, n)
        flips = flip_params(n, gen, u) if self.flip or kind == "flip" else None
        if kind == "rrc":
            return crop_resize_at(x, rrc_params(n, gen, self.scale, self.ratio, u), flips)
        if kind == "padcrop":
            pad = self.pad if self.pad is not None else max(1, h // 8)
            x = padcrop_at(x, *padcrop_params(n, pad, gen, u), pad)
        return x if flips is None else flip_at(x, flips)

    def __repr__(self) -> str:
        return f"Augment({self.kind!r}, flip={self.flip})"


def generator_for(seed: int, epoch: int, rank: int, step: int) -> torch.Generator:
    """The augmentation stream of ``rank``'s batch ``step`` in ``epoch`` alone (offset 2 keeps it
    apart from the shuffle; see the module docstring)."""
    key = [seed, epoch, 1 + rank, 2, step]
    state = np.random.SeedSequence(key).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class PositionDraws:
    """The augmentation uniforms of the samples at global positions ``first, first + 1, ...``
    of ``epoch``: counter-based (splitmix64 of a key from ``(seed, epoch)`` and the position and
    column), so each sample's draws are computed alone, vectorised, whatever batch holds it."""
    __slots__ = ("key", "first")

    def __init__(self, seed: int, epoch: int, first: int):
        state = np.random.SeedSequence([seed, epoch, 2]).generate_state(1, np.uint64)[0]
        self.key, self.first = np.uint64(state), first

    @classmethod
    def of_step(cls, seed: int, epoch: int, global_batch: int, offset: int, step: int) -> PositionDraws:
        """The draws of a rank's batch ``step``: its first sample at ``step * global_batch + offset``."""
        return cls(seed, epoch, step * global_batch + offset)

    def uniforms(self, n: int) -> torch.Tensor:
        counters: np.ndarray = (np.arange(self.first, self.first + n, dtype=np.uint64)[:, None] * np.uint64(DRAWS)
                                + np.arange(DRAWS, dtype=np.uint64))
        with np.errstate(over="ignore"):
            bits = _mix(_mix(np.bitwise_xor(counters * _GOLDEN, self.key)))
        return torch.from_numpy((bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53)
