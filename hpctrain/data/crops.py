"""Where each image is cut: the crop boxes of the ImageNet recipe, drawn on the stored image's size.

Shared by every decode path (CPU workers, :mod:`hpctrain.data.decoders`; the device path,
:mod:`hpctrain.data.gpudecode`), so they cut the same boxes by construction.

* :func:`rrc_box` — random-resized crop (Szegedy et al. 2015, "Going deeper with convolutions";
  the procedure of torchvision's ``RandomResizedCrop.get_params``): up to 10 tries of an area
  fraction uniform in ``scale`` (8–100 %) and an aspect ratio log-uniform in ``ratio`` (3/4–4/3),
  integer sides rounded, kept when the box fits the image, placed uniformly; after 10 misses the
  centre crop at the nearest allowed aspect. Plus a horizontal flip with probability 1/2.
* :func:`center_box` — evaluation: resize the shorter side to ``out / 0.875`` (256 for 224) and cut
  the centre ``out_h × out_w`` (torchvision ``Resize(256)`` + ``CenterCrop(224)``), expressed as one
  box on the stored image so the resize happens once.

Every draw of a sample comes from its own generator, seeded by ``(seed, epoch, position)``
(:func:`sample_rng`; ``position`` is the sample's place in the epoch's sequence of global batches:
``step * global_batch + rank * batch + k``), never from which rank or worker decoded it or when:
batches are identical for any number of workers, at any number of ranks that deal the same global
batches (:mod:`hpctrain.data.plan`), and after a resume that replays the same positions.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

EVAL_CROP_FRACTION = 0.875           # 224 / 256, the ImageNet evaluation recipe
RRC_TRIES = 10
# The crop key is [seed, epoch, 1, STREAM_CROPS, position] (the 1 keeps one rank's crops of before); the other
# streams' keys: block plan [seed, epoch], window shuffle [seed, epoch, 1 + lane], augmentation
# [seed, epoch, 2] (augment.PositionDraws).
STREAM_CROPS = 3


class Crop(NamedTuple):
    """A box on the stored image, in its pixels (floats allowed), and whether to mirror the result."""
    top: float
    left: float
    height: float
    width: float
    flip: bool = False


def sample_rng(seed: int, epoch: int, position: int) -> np.random.Generator:
    """The generator of one sample's crop: a pure function of its coordinates (module docstring)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 1, STREAM_CROPS, position])))


def rrc_box(h: int, w: int, rng: np.random.Generator, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
            flip: bool = True) -> Crop:
    """A random-resized-crop box on an ``h × w`` image (module docstring); ``flip``: draw a mirror."""
    area = h * w
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    box = None
    for _ in range(RRC_TRIES):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        bw, bh = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < bw <= w and 0 < bh <= h:
            top, left = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
            box = (top, left, bh, bw)
            break
    if box is None:                                  # the centre crop at the nearest allowed aspect
        in_ratio = w / h
        if in_ratio < min(ratio):
            bw, bh = w, round(w / min(ratio))
        elif in_ratio > max(ratio):
            bh, bw = h, round(h * max(ratio))
        else:
            bw, bh = w, h
        box = ((h - bh) // 2, (w - bw) // 2, bh, bw)
    mirror = bool(rng.random() < 0.5) if flip else False
    return Crop(float(box[0]), float(box[1]), float(box[2]), float(box[3]), mirror)


def center_box(h: int, w: int, out_h: int, out_w: int, fraction: float = EVAL_CROP_FRACTION) -> Crop:
    """The evaluation box: shorter side resized to ``min(out) / fraction``, centre ``out_h × out_w``."""
    short = round(min(out_h, out_w) / fraction)
    s = short / min(h, w)                            # stored pixels → resized pixels
    bh, bw = min(h, out_h / s), min(w, out_w / s)
    return Crop((h - bh) / 2, (w - bw) / 2, bh, bw, False)


def train_crops(sizes, seed: int, epoch: int, first_position: int, scale=(0.08, 1.0),
                ratio=(3 / 4, 4 / 3), flip: bool = True) -> list[Crop]:
    """The boxes of a batch whose ``k``-th image is ``sizes[k] = (h, w)`` at global position ``first_position + k``."""
    return [rrc_box(h, w, sample_rng(seed, epoch, first_position + k), scale, ratio, flip)
            for k, (h, w) in enumerate(sizes)]


def eval_crops(sizes, out_h: int, out_w: int) -> list[Crop]:
    return [center_box(h, w, out_h, out_w) for h, w in sizes]


def whole_pixels(crop: Crop, h: int, w: int, scale_y: float = 1.0, scale_x: float = 1.0) -> tuple[int, int, int, int]:
    """``(top, left, bottom, right)``: the box on an ``h × w`` picture of the image scaled by
    ``scale_y``, ``scale_x`` (a DCT-scaled decode), each edge rounded to the nearest pixel, at least one
    pixel, inside. The one rounding every decode path applies (CPU workers and the device)."""
    top = min(max(0, round(crop.top * scale_y)), h - 1)
    left = min(max(0, round(crop.left * scale_x)), w - 1)
    bottom = max(top + 1, min(h, round((crop.top + crop.height) * scale_y)))
    right = max(left + 1, min(w, round((crop.left + crop.width) * scale_x)))
    return top, left, bottom, right


def dct_scale(crop: Crop, out_h: int, out_w: int, max_denominator: int = 8) -> int:
    """The largest ``s`` in 1, 2, 4, 8 with the box at ``1/s`` still at least ``out_h × out_w``: the
    JPEG decoder may then decode at ``1/s`` in the DCT domain (never shrinking below the output,
    so the one resize after it only shrinks or barely enlarges, as from the full image)."""
    s = 1
    while s < max_denominator and crop.height / (2 * s) >= out_h and crop.width / (2 * s) >= out_w:
        s *= 2
    return s
