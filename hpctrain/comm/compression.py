"""Wire compression: what travels between ranks, as tiny strategy objects.

Horovod's ``compression.py`` gives each compressor ``compress(t) -> (t', ctx)`` and
``decompress(t', ctx)``; that suffices when the MPI library does the summing. MPI has no FP16
sum (Open MPI raises, MPICH aborts, a Python ``MPI.Op`` is far too slow: docs/environment.md),
so our ring (:mod:`hpctrain.comm.ring`) sums itself and a codec provides what
:class:`Codec` states (every codec in :data:`COMPRESSIONS` implements all of it):

* ``pack(tensors, wire, scale)``  gradients (the tensors themselves) -> the wire buffer
* ``unpack(wire, tensors)``       the wire buffer -> gradients (the tensors themselves)
* ``reduce(dst, recv, scratch, check)``  ``dst += recv`` on the wire format, accumulated in
  fp32; with ``check``, returns whether the result holds inf/NaN
* ``compresses`` / ``mpi_summable`` / ``wire_buffer(n, dtype)`` / ``scratch(n)`` / ``check_dtype``

Only :class:`hpctrain.comm.wire.Wire`, a bucket's one wire, calls ``pack``/``unpack``.

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

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from hpctrain import kernels
from hpctrain.comm.ring import SMALL_BYTES
from hpctrain.config.registries import Registry


@runtime_checkable
class Codec(Protocol):
    """The wire format contract: what the ring (:mod:`hpctrain.comm.ring`), the wire
    (:mod:`hpctrain.comm.wire`) and the tuner ask of a codec."""

    name: str               # the ``comm.compression`` value
    compresses: bool        # does the format differ from the gradients' own (a wire buffer)?
    mpi_summable: bool      # may MPI's own allreduce sum it?

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Raise a ValueError naming ``comm.compression`` for gradients it cannot carry."""

    def wire_buffer(self, n_elems: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A buffer for ``n_elems`` gradients of ``dtype`` in the wire format."""

    def scratch(self, n_elems: int) -> object:
        """What :meth:`reduce` needs beside chunks of up to ``n_elems`` (allocated once): a
        tensor or a tuple of tensors, opaque to everyone but the codec's own :meth:`reduce`."""

    def pack(self, tensors, wire: torch.Tensor, scale: float = 1.0) -> None:
        """``wire <- scale * concat(tensors)``, in the wire format."""

    def unpack(self, wire: torch.Tensor, tensors) -> None:
        """``tensors <- wire`` (split in order), in the tensors' dtype."""

    def reduce(self, dst, recv, scratch, check: bool, src=None, scale: float = 1.0) -> bool:
        """``dst = scale * (src + recv)`` on the wire format (``src`` defaults to ``dst``); with
        ``check``, whether the result holds inf/NaN."""


# A codec class, called with no arguments; registered in the order config errors list them.
COMPRESSIONS: Registry[Callable[[], Codec]] = Registry("comm.compression", "compression")


@COMPRESSIONS.register("none")
class NoCompression:
    """Full precision on the wire; the bucket itself travels (no copies, MPI can sum it), so
    strategies never pack it. ``pack``/``unpack`` are plain copies, for a caller that wants
    one wire interface whatever the codec.

    ``reduce`` goes piece by piece (``PIECE_ELEMS``) when it scales or checks: the multiply and
    the inf/NaN sum then read the piece the add just wrote while it is still in L2, instead of
    two more passes over memory."""

    name: str               # "none": set by COMPRESSIONS.register
    compresses = False
    mpi_summable = True
    PIECE_ELEMS = 1 << 17   # 512 KiB of fp32

    def check_dtype(self, dtype: torch.dtype) -> None:
        """Any floating dtype MPI can sum."""

    def wire_buffer(self, n_elems: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(n_elems, dtype=dtype)

    def pack(self, tensors, wire, scale: float = 1.0) -> None:
        lo = 0
        for t in tensors:
            hi = lo + t.numel()
            torch.mul(t.reshape(-1), scale, out=wire[lo:hi])
            lo = hi

    def unpack(self, wire, tensors) -> None:
        lo = 0
        for t in tensors:
            hi = lo + t.numel()
            t.copy_(wire[lo:hi].view_as(t))
            lo = hi

    def scratch(self, n_elems: int) -> torch.Tensor:
        return torch.empty(-(-n_elems // self.PIECE_ELEMS), dtype=torch.float64)

    def reduce(self, dst, recv, scratch, check: bool, src=None, scale: float = 1.0) -> bool:
        """``dst = scale * (src + recv)`` (``src`` defaults to ``dst``: in place)."""
        src = dst if src is None else src
        if scale == 1.0 and not check:
            torch.add(src, recv, out=dst)
            return False
        n, piece = dst.numel(), self.PIECE_ELEMS
        sums = scratch if scratch is not None and scratch.numel() >= -(-n // piece) \
            else torch.empty(-(-n // piece), dtype=torch.float64)
        for k, lo in enumerate(range(0, n, piece)):
            hi = min(lo + piece, n)
            o = dst[lo:hi]
            torch.add(src[lo:hi], recv[lo:hi], out=o)
            if scale != 1.0:
                o.mul_(scale)
            if check:
                sums[k] = o.sum()
        return check and n > 0 and not bool(torch.isfinite(sums[:-(-n // piece)].sum()))


@COMPRESSIONS.register("fp16")
class FP16Compression:
    """IEEE half precision on the wire, FP32 accumulation of partial sums.

    ``pack``/``unpack`` are the multi-tensor ``kernels`` (gradients <-> wire, where a
    full-precision bucket copies). ``reduce`` widens both fp16 operands piece by piece into fp32
    scratch that stays in L2, adds there and rounds the sum once: torch ``copy_`` fp32<->fp16 is
    vectorised (NumPy's ``astype`` is scalar) and a mixed-dtype ``add_`` is several times slower
    than converting first; this loop reads each operand once, where three whole-chunk kernel
    calls (unpack, unpack-accumulate, pack) read them three times (figures: docs/environment.md).
    Every value on the wire - each pre-divided gradient
    and each partial sum - is rounded to fp16 once: relative error ~(n+1) 2^-11 of the mean
    |gradient| for n ranks.
    """

    name: str               # "fp16": set by COMPRESSIONS.register
    compresses = True
    mpi_summable = False
    PIECE_ELEMS = 1 << 16   # 2 x 256 KiB of fp32 scratch: both operands stay in L2

    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype != torch.float32:
            raise ValueError(f"comm.compression: fp16 needs float32 gradients, got {dtype} "
                             "(use compression 'none')")

    def wire_buffer(self, n_elems: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(n_elems, dtype=torch.float16)

    def scratch(self, n_elems: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        piece = min(n_elems, self.PIECE_ELEMS)
        n_pieces = -(-n_elems // self.PIECE_ELEMS)
        return torch.empty(piece), torch.empty(piece), torch.empty(n_pieces)

    def pack(self, tensors, wire, scale: float = 1.0) -> None:
        kernels.pack_fp16(tensors, wire, scale)     # overflow shows as inf in ``wire``

    def unpack(self, wire, tensors) -> None:
        kernels.unpack_fp16(wire, tensors, 1.0)

    def reduce(self, dst, recv, scratch, check: bool, src=None, scale: float = 1.0) -> bool:
        """``dst = scale * (src + recv)`` in fp32, rounded once (``src`` defaults to ``dst``)."""
        src = dst if src is None else src
        a_all, b_all, sums = scratch
        n, piece = dst.numel(), self.PIECE_ELEMS
        for k, lo in enumerate(range(0, n, piece)):
            hi = min(lo + piece, n)
            a, b = a_all[:hi - lo], b_all[:hi - lo]
            a.copy_(src[lo:hi])
            b.copy_(recv[lo:hi])
            a.add_(b)
            if scale != 1.0:
                a.mul_(scale)
            dst[lo:hi].copy_(a)                     # inf where the rounded sum overflows
            if check:
                torch.sum(dst[lo:hi], dim=0, dtype=torch.float32, out=sums[k])
        return check and n > 0 and not bool(torch.isfinite(sums[:-(-n // piece)].sum()))


def get(name: str, **options) -> Codec:
    """The codec called ``name``, built with ``options`` (its constructor's keywords: the
    ``[comm.<name>]`` sub-table); a ValueError names the valid choices."""
    return COMPRESSIONS.get(name)(**options)


def wire_codec(codec: Codec, n_bytes: int, n_ranks: int) -> Codec:
    """The codec a buffer of ``n_bytes`` travels with among ``n_ranks``: ``codec`` where it
    compresses something worth compressing, else full precision (buckets of at most
    ``ring.SMALL_BYTES`` are latency-bound, and one rank sends nothing). One rule for every
    strategy; it depends only on sizes every rank agrees on."""
    if codec.compresses and n_bytes > SMALL_BYTES and n_ranks > 1:
        return codec
    return NoCompression()
