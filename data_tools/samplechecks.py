"""The checks a source's samples and labels pass before anything is converted.

Input is untrusted: each limit is checked before the memory it guards is allocated, and a
violation is one :class:`SourceError` naming the file (and the sample where known). The limits
are the library's (:mod:`hpctrain.data.indexfields`), so what ``convert`` writes is what the
loader reads.
"""
from __future__ import annotations

import math

import numpy as np

from hpctrain.data.indexfields import MAX_CLASSES, MAX_SAMPLE_BYTES  # the limits the index is read with
from hpctrain.errors import UserError

_SCAN_BYTES = 32 << 20           # samples checked for NaN/inf per step (bounds the temporary mask)

__all__ = ["MAX_CLASSES", "MAX_SAMPLE_BYTES", "SourceError", "check_sample_bytes", "check_samples", "count_classes",
           "held_out_count", "train_test_split"]


class SourceError(UserError):
    """The source file or folder is unusable (message names it, and the sample where known)."""


def held_out_count(n: int, test_fraction: float, origin: str) -> int:
    """Samples held out of ``n``; refuses a fraction outside [0, 1) or one that leaves no training sample."""
    if not 0 <= test_fraction < 1:
        raise SourceError(f"{origin}: --test-fraction {test_fraction} must be in [0, 1)")
    n_test = int(round(n * test_fraction))
    if n - n_test < 1:
        raise SourceError(f"{origin}: {n} sample(s) with --test-fraction {test_fraction} leave no training sample")
    return n_test


def train_test_split(x, y, test_fraction: float, seed: int, origin: str = "source") -> dict[str, tuple]:
    """A fixed, seeded split (the same on every machine)."""
    n_test = held_out_count(len(x), test_fraction, origin)
    perm = np.random.default_rng(seed).permutation(len(x))
    te, tr = perm[:n_test], perm[n_test:]
    return {"train": (x[tr], y[tr]), "test": (x[te], y[te])}


def check_sample_bytes(shape: tuple, dtype, origin: str) -> None:
    """Refuse a sample larger than ``MAX_SAMPLE_BYTES`` before anything of that size is allocated.

    ``math.prod`` on Python ints: ``np.prod`` of huge sides would overflow int64 silently.
    """
    n_bytes = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
    if n_bytes > MAX_SAMPLE_BYTES:
        raise SourceError(f"{origin}: one sample is {np.dtype(dtype)} {tuple(shape)} = {n_bytes / 2**20:,.0f} MiB, "
                          f"over the limit of {MAX_SAMPLE_BYTES >> 20} MiB per sample")


def check_samples(x: np.ndarray, where: str, allow_nonfinite: bool = False) -> None:
    """Refuse samples that would convert and then train to NaN or to nonsense.

    Bool, complex, object, string and structured arrays are always refused (a cast would guess
    what the user meant); NaN/inf in a float array are refused, naming the first bad sample,
    unless ``allow_nonfinite``. The scan goes in chunks, so its mask stays small. ``where`` names
    the file and array (or split) the sample indices count in.
    """
    if x.ndim < 1:
        raise SourceError(f"{where}: 0-d {x.dtype} array; need samples (N, ...)")
    if x.dtype.kind not in "iuf":
        hint = " (store x.astype(np.uint8) if 0/1 pixels are meant)" if x.dtype.kind == "b" else ""
        raise SourceError(f"{where}: samples are {x.dtype}; need an integer or real "
                          f"float dtype{hint}")
    if x.dtype.kind != "f" or allow_nonfinite or not len(x):
        return
    step = max(1, _SCAN_BYTES // max(x[0].nbytes, 1))
    for lo in range(0, len(x), step):
        bad = np.flatnonzero(~np.isfinite(x[lo:lo + step]).all(axis=tuple(range(1, x.ndim))))
        if bad.size:
            raise SourceError(f"{where}: sample {lo + int(bad[0])} has NaN or inf values "
                              f"(pass --allow-nonfinite to convert it anyway)")


def count_classes(labels: dict, origin: str) -> int:
    """1 + the largest label of ``{name: y}``, checked before any per-class list is built.

    Labels must be a 1-D integer array (bool and float refused), non-negative and below
    ``MAX_CLASSES``: one label of 10**9 must be an error, not 10**9 class names.
    """
    top = -1
    for name, y in labels.items():
        y = np.asarray(y)
        if y.ndim != 1 or (y.size and y.dtype.kind not in "iu"):
            raise SourceError(f"{origin}: {name}: labels must be a 1-D integer array, got {y.dtype} {y.shape}")
        if not y.size:
            continue
        lo, hi = int(np.argmin(y)), int(np.argmax(y))
        if y[lo] < 0:
            raise SourceError(f"{origin}: {name}: sample {lo} has a negative label ({int(y[lo])})")
        if y[hi] >= MAX_CLASSES:
            raise SourceError(f"{origin}: {name}: sample {hi} has label {int(y[hi])}; at most "
                              f"{MAX_CLASSES:,} classes (labels 0..{MAX_CLASSES - 1}) are supported")
        top = max(top, int(y[hi]))
    return top + 1
