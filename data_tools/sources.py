"""Readers that turn a source dataset into ``{split: (x, y)}`` arrays plus class names.

Each reader is registered by name (``--from NAME``); images are ``(N, C, H, W)`` uint8 or float.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

SOURCES: dict[str, Callable] = {}


class SourceError(Exception):
    """The source file or folder is unusable (message names it)."""


def source(name: str):
    def deco(fn):
        SOURCES[name] = fn
        return fn
    return deco


def train_test_split(x, y, test_fraction: float, seed: int):
    """A fixed, seeded split (the same on every machine)."""
    perm = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    te, tr = perm[:n_test], perm[n_test:]
    return {"train": (x[tr], y[tr]), "test": (x[te], y[te])}


@source("digits")
def load_digits(src: str | None, *, test_fraction: float = 0.2, seed: int = 0, **_):
    """scikit-learn's bundled handwritten digits: 1,797 8×8 images, values 0..16, 10 classes."""
    from sklearn.datasets import load_digits as sk_digits
    d = sk_digits()
    x = d.images.astype(np.uint8)[:, None, :, :]   # (N, 1, 8, 8), values 0..16
    return train_test_split(x, d.target.astype(np.int64), test_fraction, seed), [str(c) for c in d.target_names]


@source("npz")
def load_npz(src: str | None, *, test_fraction: float = 0.2, seed: int = 0, **_):
    """A ``.npz`` with arrays ``x`` and ``y`` (and optionally ``x_test``, ``y_test``)."""
    if not src or not os.path.exists(src):
        raise SourceError(f"{src}: npz file not found")
    try:
        with np.load(src, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as exc:
        raise SourceError(f"{src}: not a readable .npz ({exc})") from None
    for key in ("x", "y"):
        if key not in arrays:
            raise SourceError(f"{src}: missing array {key!r} (has {', '.join(arrays) or 'none'})")
    x, y = arrays["x"], arrays["y"]
    if len(x) != len(y):
        raise SourceError(f"{src}: 'x' has {len(x)} samples but 'y' has {len(y)}")
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise SourceError(f"{src}: 'y' must be a 1-D integer label array, got {y.dtype} {y.shape}")
    if (y < 0).any():
        raise SourceError(f"{src}: 'y' has negative labels")
    if "x_test" in arrays:
        splits = {"train": (x, y), "test": (arrays["x_test"], arrays["y_test"])}
    else:
        splits = train_test_split(x, y, test_fraction, seed)
    n_classes = int(max(int(s[1].max(initial=-1)) for s in splits.values())) + 1
    return splits, [str(c) for c in range(n_classes)]
