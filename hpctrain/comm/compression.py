"""Wire compression: what travels between ranks, as tiny strategy objects.

Horovod's ``compression.py`` gives each compressor ``compress(t) -> (t', ctx)`` and
``decompress(t', ctx)``; that suffices when the MPI library does the summing. MPI has no FP16
sum (Open MPI raises, MPICH aborts; a Python ``MPI.Op`` costs 190-370 ms per 26 M elements,
DESIGN.md), so our ring (:mod:`hpctrain.comm.ring`) sums itself and a codec provides:

* ``pack(tensors, wire, scale)``  fp32 tensors (the gradients themselves) -> the wire buffer
* ``unpack(wire, tensors)``       the wire buffer -> fp32 tensors (the gradients themselves)
* ``reduce(dst, recv, scratch, check)``  ``dst += recv`` on the wire format, accumulated in
  fp32; with ``check``, returns whether the result holds inf/NaN
* ``compresses`` / ``mpi_summable`` / ``wire_buffer(n)`` / ``scratch(n)`` / ``check_dtype``

Pack and unpack are the multi-tensor ``kernels`` (one CuPy launch on GPU), called where a
full-precision strategy copies: gradients -> bucket before, bucket -> gradients after. So fp16
costs no extra pass over the bucket; the collective itself moves and adds fp16 only (the add is
a CPU torch loop: on GPU it would want a fused fp16 add kernel in ``kernels``).
Strategies never branch on dtype: they hand buffers to the codec. Buckets of at most
``ring.SMALL_BYTES`` are latency-bound and travel uncompressed.

Pre-division: ``GradSync`` gathers ``grad / world_size`` (``scale``), so every fp16 value on the
wire is already divided (Horovod's ``gradient_predivide_factor``, torch's ``fp16_compress_hook``)
and the sum of ``world`` gradients of magnitude up to 65504 cannot overflow.
"""
from __future__ import annotations

import torch

import kernels
from hpctrain.comm.ring import nonfinite


class NoCompression:
    """Full precision on the wire; the bucket itself travels (no copies, MPI can sum it)."""

    name = "none"
    compresses = False
    mpi_summable = True

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Any floating dtype MPI can sum."""

    def scratch(self, n_elems: int):
        return None

    def reduce(self, dst, recv, scratch, check: bool) -> bool:
        dst.add_(recv)
        return nonfinite(dst) if check else False


class FP16Compression:
    """IEEE half precision on the wire, FP32 accumulation of partial sums.

    ``pack``/``unpack`` are the multi-tensor ``kernels`` (gradients <-> wire, where a
    full-precision bucket copies). ``reduce`` widens both fp16 operands piece by piece into fp32
    scratch that stays in L2, adds there and rounds the sum once: torch ``copy_`` fp32<->fp16 is
    vectorised (NumPy's ``astype`` is scalar, 27 ms per 16 M elements) and a mixed-dtype
    ``add_`` is 6x slower than converting first (DESIGN.md). Three whole-chunk kernel calls
    (unpack, unpack-accumulate, pack) measured 25 ms per 8 M elements against 8 ms for this
    loop, which reads each operand once. Every value on the wire - each pre-divided gradient
    and each partial sum - is rounded to fp16 once: relative error ~(n+1) 2^-11 of the mean
    |gradient| for n ranks.
    """

    name = "fp16"
    compresses = True
    mpi_summable = False
    PIECE_ELEMS = 1 << 16   # 2 x 256 KiB of fp32 scratch: both operands stay in L2

    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype != torch.float32:
            raise ValueError(f"comm.compression: fp16 needs float32 gradients, got {dtype} "
                             "(use compression 'none')")

    def wire_buffer(self, n_elems: int) -> torch.Tensor:
        return torch.empty(n_elems, dtype=torch.float16)

    def scratch(self, n_elems: int):
        piece = min(n_elems, self.PIECE_ELEMS)
        n_pieces = -(-n_elems // self.PIECE_ELEMS)
        return torch.empty(piece), torch.empty(piece), torch.empty(n_pieces)

    def pack(self, tensors, wire, scale: float = 1.0) -> None:
        kernels.pack_fp16(tensors, wire, scale)     # overflow shows as inf in ``wire``

    def unpack(self, wire, tensors) -> None:
        kernels.unpack_fp16(wire, tensors, 1.0)

    def reduce(self, dst, recv, scratch, check: bool) -> bool:
        a_all, b_all, sums = scratch
        n, piece = dst.numel(), self.PIECE_ELEMS
        for k, lo in enumerate(range(0, n, piece)):
            hi = min(lo + piece, n)
            a, b = a_all[:hi - lo], b_all[:hi - lo]
            a.copy_(dst[lo:hi])
            b.copy_(recv[lo:hi])
            a.add_(b)
            dst[lo:hi].copy_(a)                     # inf where the rounded sum overflows
            if check:
                torch.sum(dst[lo:hi], dim=0, dtype=torch.float32, out=sums[k])
        return check and n > 0 and not bool(torch.isfinite(sums[:-(-n // piece)].sum()))


COMPRESSIONS = {c.name: c for c in (NoCompression, FP16Compression)}


def get(name: str):
    """The codec called ``name``; a ValueError names the valid choices."""
    try:
        return COMPRESSIONS[name]()
    except KeyError:
        raise ValueError(f"comm.compression: unknown compression {name!r} "
                         f"(choose from {', '.join(sorted(COMPRESSIONS))})") from None
