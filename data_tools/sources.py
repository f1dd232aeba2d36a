"""Source readers: each turns a dataset on disk into a :class:`Source` the writer converts.

A reader is registered by name (``--from NAME``) and returns a :class:`Source`: per split a sample
count and a ``read(lo, hi)`` that materialises samples ``[lo, hi)`` only, so a rank of a parallel
conversion touches nothing but its own shards. Array sources (digits, npz, CIFAR, MNIST) are
small enough to hold in memory; ImageFolder decodes files lazily (``imagefolder.py``).
Images are ``(N, C, H, W)``; any other ``(N, ...)`` array converts too (no resize/JPEG then).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

SOURCES: dict[str, Callable] = {}


class SourceError(Exception):
    """The source file or folder is unusable (message names it, and the sample where known)."""


def source(name: str):
    def deco(fn):
        SOURCES[name] = fn
        return fn
    return deco


@dataclass
class Chunk:
    """Samples read from a source: ``x`` as stored, ``pixels`` as decoded (for channel statistics)."""
    x: object
    y: np.ndarray
    pixels: np.ndarray


@dataclass
class SplitSource:
    num_samples: int
    read: Callable[[int, int], Chunk]


@dataclass
class Source:
    """What the writer needs: splits, class names and the stored sample layout."""
    splits: dict[str, SplitSource]
    class_names: list[str]
    sample_shape: tuple
    dtype: str
    encoding: str = "raw"
    origin: str = ""                       # names the source in error messages
    extra: dict = field(default_factory=dict)


def train_test_split(x, y, test_fraction: float, seed: int):
    """A fixed, seeded split (the same on every machine)."""
    perm = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    te, tr = perm[:n_test], perm[n_test:]
    return {"train": (x[tr], y[tr]), "test": (x[te], y[te])}


def _is_image(shape: tuple) -> bool:
    return len(shape) == 3 and shape[0] in (1, 3)


def _resize_batch(x: np.ndarray, size: tuple) -> np.ndarray:
    from hpctrain.data.images import fit, pil, to_chw
    Image = pil()
    out = np.empty((len(x), x.shape[1], *size), np.uint8)
    for k, a in enumerate(x):
        img = Image.fromarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0))
        out[k] = to_chw(fit(img, *size), a.shape[0])
    return out


def from_arrays(splits: dict, class_names: list, origin: str, *, size=None, encode: str = "raw") -> Source:
    """A :class:`Source` over in-memory ``{split: (x, y)}``; optional resize and JPEG encoding."""
    for name, (x, y) in splits.items():
        if len(x) != len(y):
            raise SourceError(f"{origin}: split {name}: {len(x)} samples but {len(y)} labels")
        y = np.asarray(y)
        if y.ndim != 1 or (y.size and not np.issubdtype(y.dtype, np.integer)):
            raise SourceError(f"{origin}: split {name}: labels must be a 1-D integer array, got {y.dtype} {y.shape}")
        bad = np.flatnonzero((y < 0) | (y >= len(class_names)))
        if bad.size:
            k = int(bad[0])
            raise SourceError(f"{origin}: split {name}: sample {k} has label {int(y[k])}, "
                              f"outside 0..{len(class_names) - 1}")
    first = next(iter(splits.values()))[0]
    shape, dtype = tuple(first.shape[1:]), first.dtype
    if (size or encode == "jpeg") and not (_is_image(shape) and dtype == np.uint8):
        raise SourceError(f"{origin}: --size/--encode jpeg need uint8 images (N, 1|3, H, W), got {dtype} {shape}")
    out_shape = (shape[0], *size) if size else shape

    def reader(x, y):
        def read(lo: int, hi: int) -> Chunk:
            px = _resize_batch(x[lo:hi], size) if size else x[lo:hi]
            if encode == "jpeg":
                from hpctrain.data.images import encode_jpeg
                return Chunk([encode_jpeg(p) for p in px], y[lo:hi], px)
            return Chunk(px, y[lo:hi], px)
        return read

    return Source({k: SplitSource(len(y), reader(x, np.asarray(y, np.int64))) for k, (x, y) in splits.items()},
                  list(class_names), out_shape, str(dtype), encode, origin)


@source("digits")
def load_digits(src: str | None, *, test_fraction: float = 0.2, seed: int = 0, size=None, encode="raw", **_):
    """scikit-learn's bundled handwritten digits: 1,797 8×8 images, values 0..16, 10 classes."""
    from sklearn.datasets import load_digits as sk_digits
    d = sk_digits()
    x = d.images.astype(np.uint8)[:, None, :, :]   # (N, 1, 8, 8), values 0..16
    splits = train_test_split(x, d.target.astype(np.int64), test_fraction, seed)
    return from_arrays(splits, [str(c) for c in d.target_names], "digits", size=size, encode=encode)


@source("npz")
def load_npz(src: str | None, *, test_fraction: float = 0.2, seed: int = 0, size=None, encode="raw",
             class_names=None, **_):
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
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise SourceError(f"{src}: 'x_test' and 'y_test' must come together")
    if "x_test" in arrays:
        splits = {"train": (arrays["x"], arrays["y"]), "test": (arrays["x_test"], arrays["y_test"])}
    else:
        if len(arrays["x"]) != len(arrays["y"]):
            raise SourceError(f"{src}: 'x' has {len(arrays['x'])} samples but 'y' has {len(arrays['y'])}")
        splits = train_test_split(arrays["x"], arrays["y"], test_fraction, seed)
    for name, (x, y) in splits.items():
        if x.shape[1:] != splits["train"][0].shape[1:] or x.dtype != splits["train"][0].dtype:
            raise SourceError(f"{src}: split {name} has {x.dtype} {x.shape[1:]}, train has "
                              f"{splits['train'][0].dtype} {splits['train'][0].shape[1:]}")
        if y.size and np.issubdtype(y.dtype, np.integer) and (y < 0).any():
            raise SourceError(f"{src}: split {name}: sample {int(np.flatnonzero(y < 0)[0])} has a negative label")
    ys = [y for _, y in splits.values() if y.size and np.issubdtype(y.dtype, np.integer)]
    n_classes = max((int(y.max()) for y in ys), default=-1) + 1
    names = class_names or [str(c) for c in range(n_classes)]
    return from_arrays(splits, names, src, size=size, encode=encode)


def register_all() -> None:
    """Import the readers that live in their own modules (each registers itself)."""
    from data_tools import cifar, idx, imagefolder  # noqa: F401
