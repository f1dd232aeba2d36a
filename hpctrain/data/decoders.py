"""JPEG bytes + a :class:`~hpctrain.data.crops.Crop` → the crop at the output size, decoded once.

Two backends with one contract (``decode_crop(blob, crop, out_h, out_w, channels, out)``):

* ``simplejpeg`` (libjpeg-turbo 3, wheels on PyPI; the default when installed) and
* ``pil`` (Pillow, ``Image.draft``; the fallback) both decode at 1/2, 1/4 or 1/8 in the DCT domain
  when the box at that scale is still at least the output size (:func:`~hpctrain.data.crops.dct_scale`),
  so a large photo is never fully decoded to be shrunk. libjpeg-turbo's other factors (3/8, 7/8…)
  are not used: measured here, a 7/8 decode then resized differs from the full decode resized by
  up to 31 grey levels (99th percentile), the powers of two by up to 26, on the same photos.
  Both release the GIL while decoding, so a pool of threads decodes in parallel.

Either way the box (scaled to the decoded size, rounded to whole pixels) is resampled to
``out_h × out_w`` once with torch's uint8 antialiased bilinear filter (the filter of Pillow's
``resize``, within a grey level or so, at about half its cost: docs/data.md has the figures),
mirrored when the crop says so, and written as (C, H, W) uint8 into ``out``. torch
releases the GIL in its operators too. Why simplejpeg over PyTurboJPEG and pillow-simd: docs/data.md
("Choosing the JPEG decoder").
Without DCT scaling the two backends give the same pixels (the same libjpeg-turbo IDCT, measured
bit-identical here); scaled, they may differ by a grey level or so: a run uses one backend
throughout (the loader picks it once).
"""
from __future__ import annotations

import io
import math

import numpy as np
import torch
import torch.nn.functional as F

from hpctrain.data.crops import Crop, dct_scale, whole_pixels
from hpctrain.data.images import pil

BACKENDS = ("auto", "simplejpeg", "pil")


def simplejpeg_module():
    """The simplejpeg module, or None when it is not installed."""
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


def resolve(backend: str = "auto") -> str:
    """``auto``: simplejpeg when installed, else Pillow."""
    if backend not in BACKENDS:
        raise ValueError(f"JPEG backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "simplejpeg" if simplejpeg_module() is not None else "pil"
    if backend == "simplejpeg" and simplejpeg_module() is None:
        from hpctrain.errors import MissingPackageError
        raise MissingPackageError("the simplejpeg JPEG backend needs simplejpeg: pip install simplejpeg")
    return backend


def _bytes(blob) -> bytes | memoryview:
    return blob.data if isinstance(blob, np.ndarray) else blob


def image_size(blob, backend: str) -> tuple[int, int]:
    """``(h, w)`` of an encoded image from its header alone."""
    if backend == "simplejpeg":
        h, w, _, _ = simplejpeg_module().decode_jpeg_header(_bytes(blob))
        return int(h), int(w)
    with pil().open(io.BytesIO(_bytes(blob))) as img:
        return img.height, img.width


def _finish(a: np.ndarray, crop: Crop, h: int, w: int, out_h: int, out_w: int, out: np.ndarray) -> None:
    """Cut ``crop`` (a box on the ``h × w`` stored image) out of ``a``, the decoded (H, W[, C]) picture
    (DCT-scaled or not), resize it to ``out_h × out_w``, mirror if asked, into ``out`` (C, H, W)."""
    t = torch.from_numpy(a)
    t = t.unsqueeze(-1) if t.dim() == 2 else t
    dh, dw = t.shape[:2]
    top, left, bottom, right = whole_pixels(crop, dh, dw, dh / h, dw / w)
    region = t[top:bottom, left:right].permute(2, 0, 1).unsqueeze(0)      # a channels-last view, no copy
    if region.shape[-2:] != (out_h, out_w):
        region = F.interpolate(region, size=(out_h, out_w), mode="bilinear", antialias=True, align_corners=False)
    if crop.flip:
        region = region.flip(-1)
    torch.from_numpy(out).copy_(region[0, :out.shape[0]])


def decode_crop(blob, crop: Crop, size: tuple[int, int], out_h: int, out_w: int, channels: int,
                out: np.ndarray, backend: str) -> None:
    """Decode ``blob`` (an ``h × w`` JPEG, ``size``) into ``out`` (C, out_h, out_w): the ``crop`` box
    resized once, mirrored if asked. Raises whatever the backend raises on a bad file."""
    h, w = size
    mode = "L" if channels == 1 else "RGB"
    s = dct_scale(crop, out_h, out_w)
    if backend == "simplejpeg":           # 1/s is the smallest factor that gives these minimum sides
        a = simplejpeg_module().decode_jpeg(_bytes(blob), colorspace="GRAY" if channels == 1 else "RGB",
                                            min_height=math.ceil(h / s), min_width=math.ceil(w / s))
    else:
        with pil().open(io.BytesIO(_bytes(blob))) as img:
            if s > 1:
                img.draft(mode, (w // s, h // s))
            a = np.array(img.convert(mode) if img.mode != mode else img)    # writable, for torch
    _finish(a, crop, h, w, out_h, out_w, out)
