"""Image decoding and resizing with Pillow, shared by the converter and the loader.

``fit`` is the evaluation-style transform of the ImageNet recipes (torchvision's
``Resize`` + ``CenterCrop``): scale so the image covers ``h × w``, then cut the centre. JPEG
shards store encoded bytes; for shards fitted to ``sample_shape`` (index ``jpeg.stored ==
"fitted"``) the loader's decode pool decodes each with :func:`decode` (:class:`jpegstream.FittedDecoder`).
Whole-image shards are cut at decode time instead (:mod:`decoders`, :mod:`crops`).
"""
from __future__ import annotations

import io
from types import ModuleType
from typing import Any

import numpy as np

from hpctrain.errors import MissingPackageError


def pil() -> ModuleType:
    """Pillow's Image module, or an ImportError (a user error) that says what to install."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingPackageError("image datasets need Pillow: pip install Pillow") from exc
    return Image


def fit(img: Any, h: int, w: int) -> Any:
    """Resize ``img`` (a PIL image) to cover ``h × w`` keeping its aspect, then centre-crop."""
    scale = max(h / img.height, w / img.width)
    size = (max(w, round(img.width * scale)), max(h, round(img.height * scale)))
    if size != img.size:
        img = img.resize(size, pil().Resampling.BILINEAR, reducing_gap=3.0)
    left, top = (img.width - w) // 2, (img.height - h) // 2
    return img.crop((left, top, left + w, top + h))


def to_chw(img, channels: int) -> np.ndarray:
    """PIL image → (C, H, W) uint8 with ``channels`` 1 (L) or 3 (RGB)."""
    img = img.convert("L" if channels == 1 else "RGB")
    a = np.asarray(img, dtype=np.uint8)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


def decode(blob, shape: tuple) -> np.ndarray:
    """Encoded image bytes → (C, H, W) uint8 of ``shape`` (resized and centre-cropped)."""
    Image = pil()
    c, h, w = shape
    with Image.open(io.BytesIO(blob.tobytes() if isinstance(blob, np.ndarray) else blob)) as img:
        img.draft("RGB" if c == 3 else "L", (w, h))   # JPEG: let libjpeg downscale by 2^k first
        return to_chw(fit(img, h, w), c)


def decode_batch(blobs, shape: tuple) -> np.ndarray:
    """An (n,) object array of encoded images → (n, *shape) uint8."""
    out = np.empty((len(blobs), *shape), np.uint8)
    for k, blob in enumerate(blobs):
        out[k] = decode(blob, shape)
    return out


def encode_jpeg(chw: np.ndarray, quality: int = 95) -> bytes:
    """(C, H, W) uint8 → JPEG bytes."""
    Image = pil()
    a = chw[0] if chw.shape[0] == 1 else chw.transpose(1, 2, 0)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(a)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()
