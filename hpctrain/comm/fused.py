"""Element-wise passes over gradient buffers after a reduction: the scale to the mean, the
inf/NaN check, copies into other ranks' outputs.

:func:`sum_into` does them chunk by chunk while a chunk is in L2 where more than two sources are
added (the output chunk stays in cache across the adds), as whole-tensor passes otherwise (one
add: nothing to keep in cache; the per-chunk calls cost without a gain). :func:`scale_and_check`
keeps two whole-tensor passes over a buffer a reduction has just written (still in cache).
"""
from __future__ import annotations

import numpy as np
import torch

SMALL_ELEMS = 1 << 14


def nonfinite(t: torch.Tensor) -> bool:
    """Does ``t`` hold inf or NaN?

    Small tensors: NumPy ``isfinite`` (a torch reduction's dispatch alone costs more than NumPy's
    whole pass over a small tensor). Large: one vectorised fp32 ``sum`` pass - inf and NaN
    propagate through it - measured cheaper than ``aminmax`` and far cheaper than
    ``isfinite(t).all()`` (which materialises a bool tensor; measurements: docs/environment.md).
    A finite tensor could only be misreported if its sum exceeded 3.4e38 (mean |value| above
    4e31 for 8 M elements): a skipped step at worst, never a missed inf.
    """
    if t.numel() <= SMALL_ELEMS and t.device.type == "cpu":
        return not bool(np.isfinite(t.detach().numpy()).all())
    total = t.sum(dtype=torch.float32) if t.dtype == torch.float16 else t.sum()
    return not bool(torch.isfinite(total))


CHUNK_ELEMS = 1 << 18
"""Elements summed per step where more than two sources are added (1 MiB of fp32 out): the
output chunk stays in L2 across the adds; smaller chunks measured slower (Python dispatch per
chunk)."""


def sum_into(srcs, out: torch.Tensor, scale: float = 1.0, chunk: int | None = None, copies=(),
             check: bool = False) -> bool:
    """``out = scale * sum(srcs)``, element-wise, in fixed order; each chunk is also copied into
    every tensor of ``copies``. With ``check``, returns whether ``out`` holds inf/NaN (a sum per
    chunk). ``chunk`` None: :data:`CHUNK_ELEMS` for more than two sources, else the whole tensor
    as one chunk: with two sources (two ranks on a node) there is one add, so chunking keeps
    nothing in cache that a whole pass would not; its calls per chunk (about 9) measured never
    faster and up to 10 % slower on an MLP bucket (``hpctrain.tools.bench.node_sum``)."""
    n = out.numel()
    if chunk is None:
        chunk = CHUNK_ELEMS if len(srcs) > 2 else max(n, 1)
    sums: list[torch.Tensor] = []
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        o = out[lo:hi]
        if len(srcs) == 1:
            if scale != 1.0:
                torch.mul(srcs[0][lo:hi], scale, out=o)
            elif srcs[0] is not out:
                o.copy_(srcs[0][lo:hi])
        else:
            torch.add(srcs[0][lo:hi], srcs[1][lo:hi], out=o)
            for s in srcs[2:]:
                o.add_(s[lo:hi])
            if scale != 1.0:
                o.mul_(scale)
        for c in copies:
            c[lo:hi].copy_(o)
        if check:
            sums.append(o.sum())
    if not sums:
        return False
    total = sums[0] if len(sums) == 1 else torch.stack(sums).sum(dtype=torch.float64)
    return not bool(torch.isfinite(total))


def nonfinite_flag(t: torch.Tensor) -> torch.Tensor:
    """Does ``t`` hold inf or NaN, as a 0-d bool tensor on ``t``'s device: no host read (the
    sum pass of :func:`nonfinite`; the caller reads it when it must, once for many)."""
    total = t.sum(dtype=torch.float32) if t.dtype == torch.float16 else t.sum()
    return torch.isfinite(total).logical_not()


def scale_and_check(t: torch.Tensor, scale: float = 1.0, keep: bool = False) -> bool | torch.Tensor:
    """``t *= scale`` in place, then: does ``t`` hold inf/NaN? Two whole-tensor passes: right
    after a reduction the tensor is still in L3, where they measured faster than the chunked
    :func:`sum_into`, which pays Python dispatch per chunk (docs/environment.md).

    ``keep`` (device memory): the answer stays on the device as a 0-d bool tensor
    (:func:`nonfinite_flag`), read once per round by :func:`hpctrain.comm.streams.any_flag`;
    ``bool()`` here would block the calling thread - autograd's, under ``comm.overlap`` - until
    the compute stream drained, once per bucket."""
    if scale != 1.0:
        t.mul_(scale)
    return nonfinite_flag(t) if keep else nonfinite(t)
