"""Wire compression: what a partial sum looks like on the wire, as tiny strategy objects.

Horovod's ``compression.py`` gives each compressor ``compress(t) -> (t', ctx)`` and
``decompress(t', ctx)``; that suffices when the MPI library does the summing. MPI has no FP16
sum (Open MPI raises, MPICH aborts; a Python ``MPI.Op`` costs 190-370 ms per 26 M elements,
DESIGN.md), so our ring (:mod:`hpctrain.comm.ring`) sums itself and needs four hooks instead:

* ``encode(src, wire, scale)``  a partial sum held in fp32 ``src`` -> what travels (``wire``)
* ``add(recv, dst, scale)``     ``dst += `` the partial sum a neighbour sent (accumulated in fp32)
* ``own(src, wire, scale)``     the chunk this rank completed: finalise it in ``wire`` (scaled)
                                for the allgather; returns True if it holds inf/NaN
* ``finish(wire, dst, scale)``  ``dst <- scale * total`` from the fully gathered wire buffer

Strategies never branch on dtype: they hand buffers to the codec. Buckets of at most
``ring.SMALL_BYTES`` are latency-bound and travel uncompressed (see :mod:`hpctrain.comm.ring`).

Pre-division: ``GradSync`` gathers ``grad / world_size`` into its buckets (the gather copy
multiplies for free), so the strategies call the codecs with ``scale = 1`` and every fp16 value
on the wire is already pre-divided (Horovod's ``gradient_predivide_factor``, torch's
``fp16_compress_hook``): the sum of ``world`` gradients of magnitude up to 65504 cannot overflow.
For callers with undivided buffers the codecs take ``scale = 1 / world``: ``none`` applies it
after summing, to the one chunk each rank completes; ``fp16`` before rounding to fp16.
"""
from __future__ import annotations

import torch

import kernels
from hpctrain.comm.ring import nonfinite


class NoCompression:
    """Full precision on the wire; the wire buffer *is* the accumulator (no copies)."""

    name = "none"

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Any floating dtype MPI can sum."""

    def wire_buffer(self, acc: torch.Tensor) -> torch.Tensor:
        return acc

    def encode(self, src, wire, scale: float) -> None:
        """Nothing to do: ``wire`` is ``src``."""

    def add(self, recv, dst, scale: float) -> None:
        dst.add_(recv)

    def own(self, src, wire, scale: float) -> bool:
        if scale != 1.0:
            src.mul_(scale)
        return nonfinite(src)

    def finish(self, wire, dst, scale: float) -> None:
        """Nothing to do: every chunk arrived scaled, in place."""


class FP16Compression:
    """IEEE half precision on the wire, FP32 accumulation, pre-division by ``1 / scale``.

    Conversions run in the ``kernels`` package (one CuPy launch on GPU, vectorised torch on CPU:
    ``copy_`` fp32<->fp16 is ~2.4 ms per 16 M elements where NumPy's ``astype`` is scalar and
    takes 27 ms, DESIGN.md). Accumulation widens the received fp16 first and adds in fp32
    (a mixed-dtype ``add_`` is 6x slower). Partial sums stay in *unscaled* fp32 units between
    hops (``add`` multiplies by ``1 / scale``) and are scaled again when re-encoded, so every
    value on the wire is pre-divided; one fp32 rounding per hop is the price (~1e-7 relative,
    far below fp16's 4.9e-4).
    """

    name = "fp16"

    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype != torch.float32:
            raise ValueError(f"comm.compression: fp16 needs float32 gradients, got {dtype} "
                             "(use compression 'none')")

    def wire_buffer(self, acc: torch.Tensor) -> torch.Tensor:
        return torch.empty(acc.numel(), dtype=torch.float16, device=acc.device)

    def encode(self, src, wire, scale: float) -> None:
        kernels.pack_fp16([src], wire, scale)      # overflow shows as inf in ``wire``

    def add(self, recv, dst, scale: float) -> None:
        kernels.unpack_fp16(recv, [dst], 1.0 / scale, accumulate=True)

    def own(self, src, wire, scale: float) -> bool:
        # The flag is of the fp16 values every rank will hold: overflow in rounding shows.
        return bool(kernels.pack_fp16([src], wire, scale))

    def finish(self, wire, dst, scale: float) -> None:
        kernels.unpack_fp16(wire, [dst], 1.0)      # the wire already holds scale * total


COMPRESSIONS = {c.name: c for c in (NoCompression, FP16Compression)}


def get(name: str):
    """The codec called ``name``; a ValueError names the valid choices."""
    try:
        return COMPRESSIONS[name]()
    except KeyError:
        raise ValueError(f"comm.compression: unknown compression {name!r} "
                         f"(choose from {', '.join(sorted(COMPRESSIONS))})") from None
