"""The index's descriptive fields, checked at open with the limits ``data_tools convert`` writes by.

The digests prove the shards are the ones the index names; they say nothing of the index's own
fields, which a hand-edited or foreign ``index.json`` can set to anything. Each field is checked
here before any of it is used (a model sized, a buffer allocated, a batch normalised), and a
wrong one is one line naming the file and the field (:class:`~hpctrain.data.index.ShardError`,
status 2), never a traceback or a run that trains on nonsense:

* ``dtype``: a NumPy integer or real float type (bool, complex, object, strings refused, as
  ``convert`` refuses such samples);
* ``sample_shape``: up to :data:`MAX_DIMS` positive integer sides, one sample at most
  :data:`MAX_SAMPLE_BYTES` (what ``convert`` accepts);
* ``num_classes``: an integer in ``1..MAX_CLASSES`` (labels ``0..MAX_CLASSES-1``, as ``convert``);
  ``class_names``, when given, that many strings;
* ``normalize``: ``mean`` and ``std`` lists of one finite real number per channel (the first side
  of the sample shape), every ``std`` > 0 (a constant channel is written as 1 by ``convert``);
* ``encoding == "jpeg"``: ``dtype`` uint8 and ``sample_shape`` (C, H, W) with C 1 or 3 (what a
  JPEG decodes to, and what the decoders write).

The limits live here, in the library; ``data_tools`` imports them, so both sides agree.
"""
from __future__ import annotations

import math

import numpy as np

MAX_CLASSES = 100_000            # one output unit and one name per class: a larger label is a corrupt file
MAX_SAMPLE_BYTES = 256 << 20     # one decoded sample; each rank holds a chunk of at least one in memory
MAX_DIMS = 8


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def field_problems(meta: dict) -> tuple[str, str] | None:
    """``(field, why)`` for the first descriptive field of ``meta`` that is wrong, or None."""
    dtype = meta.get("dtype")
    try:
        dt = np.dtype(dtype) if isinstance(dtype, str) else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "iuf":
        return "dtype", f"is {dtype!r:.40}: need an integer or real float type (bool, complex and object are refused)"
    shape = meta.get("sample_shape")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and all(_is_int(d) and d > 0 for d in shape)):
        return "sample_shape", f"is {shape!r:.60}: need a list of at most {MAX_DIMS} positive integers"
    n_bytes = math.prod(shape) * dt.itemsize
    if n_bytes > MAX_SAMPLE_BYTES:
        return "sample_shape", (f"{dt} {tuple(shape)} is {n_bytes / 2**20:,.0f} MiB a sample, over the limit of "
                                f"{MAX_SAMPLE_BYTES >> 20} MiB")
    jpeg = _jpeg_problem(dt, shape) if meta.get("encoding") == "jpeg" else None
    if jpeg:
        return jpeg
    k = meta.get("num_classes")
    if not (isinstance(k, int) and _is_int(k) and 1 <= k <= MAX_CLASSES):
        return "num_classes", f"is {k!r:.40}: need an integer in 1..{MAX_CLASSES:,}"
    names = meta.get("class_names", [])
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and len(names) in (0, k)):
        return "class_names", f"must be a list of {k} strings (one per class), got {names!r:.60}"
    return _normalize_problem(meta.get("normalize", {}), shape[0] if shape else 1)


def _jpeg_problem(dt: np.dtype, shape: list) -> tuple[str, str] | None:
    if dt != np.uint8:
        return "dtype", f"is {dt}: a JPEG index decodes to uint8"
    if len(shape) != 3 or shape[0] not in (1, 3):
        return "sample_shape", f"is {shape!r:.60}: a JPEG index needs (C, H, W) with C 1 (grey) or 3 (RGB)"
    return None


def _normalize_problem(norm, channels: int) -> tuple[str, str] | None:
    if not isinstance(norm, dict):
        return "normalize", f"is {norm!r:.40}: need an object with 'mean' and 'std'"
    for key in ("mean", "std"):
        if key not in norm:
            continue
        v = norm[key]
        if not (isinstance(v, list) and len(v) == channels and all(_is_real(m) for m in v)):
            return (f"normalize.{key}", f"is {v!r:.60}: need {channels} finite number(s), one per channel "
                                         f"(the first side of sample_shape)")
        if key == "std" and not all(s > 0 for s in v):
            return "normalize.std", f"is {v!r:.60}: every standard deviation must be > 0 (it divides)"
    return None
