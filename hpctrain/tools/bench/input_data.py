"""Photos for ``bench input`` and the decode tests, made here (nothing downloaded).

The source pictures are the two real photographs scikit-learn ships (``load_sample_images``:
``china.jpg`` and ``flower.jpg``, 427 × 640); each image is a random window of one of them, resized to
a random size around ``size`` and saved as a JPEG (quality 90, 4:2:0), like an ImageNet training
photo (about 400 × 350, 110 KB on average there; ~50 KB here). Deterministic for a seed.
"""
from __future__ import annotations

import io
import os

import numpy as np


def sample_photos() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images
    return [np.asarray(a) for a in load_sample_images().images]


def photos(n: int, seed: int = 0, size: tuple[int, int] = (340, 400), spread: float = 0.25,
           quality: int = 90) -> list[bytes]:
    """``n`` JPEG files (bytes) of about ``size`` (h, w) pixels, each side within ±``spread``."""
    from PIL import Image
    rng = np.random.default_rng(seed)
    srcs = sample_photos()
    out = []
    for _ in range(n):
        src = srcs[int(rng.integers(len(srcs)))]
        sh, sw = src.shape[:2]
        ch, cw = int(rng.integers(sh // 2, sh + 1)), int(rng.integers(sw // 2, sw + 1))
        top, left = int(rng.integers(0, sh - ch + 1)), int(rng.integers(0, sw - cw + 1))
        h = max(16, round(size[0] * (1 + rng.uniform(-spread, spread))))
        w = max(16, round(size[1] * (1 + rng.uniform(-spread, spread))))
        img = Image.fromarray(src[top:top + ch, left:left + cw]).resize((w, h), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def image_folder(root: str, n: int, classes: int = 4, seed: int = 0, size=(340, 400)) -> str:
    """An ImageFolder tree ``root/<class>/<k>.jpg`` of :func:`photos`; returns ``root``."""
    for k, blob in enumerate(photos(n, seed, size)):
        d = os.path.join(root, f"c{k % classes}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{k:05d}.jpg"), "wb") as fh:
            fh.write(blob)
    return root
