"""A wire codec in one file: bfloat16 gradients on the wire (``comm.compression``).

Select it without editing the package: ``--set comm.compression=examples.plugins.bf16_codec:bf16``
(from the repository root, which ``python -m hpctrain`` puts on ``sys.path``).

Half the bytes, like ``fp16``, but with fp32's exponent range: a pre-divided gradient or a partial
sum never overflows where fp32 would not, at 8 mantissa bits (relative error ~(n+1) 2^-8 for n
ranks, eight times fp16's). Accumulation is fp16's: each pair of operands is widened into fp32
scratch, added there and rounded once (:class:`~hpctrain.comm.compression.FP16Compression`'s
``reduce`` does not depend on the wire dtype), so only the format-specific parts are here.
"""
from __future__ import annotations

import torch

from hpctrain.comm.compression import COMPRESSIONS, FP16Compression


@COMPRESSIONS.register("bf16")
class BF16Compression(FP16Compression):
    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype != torch.float32:
            raise ValueError(f"comm.compression: bf16 needs float32 gradients, got {dtype} (use compression 'none')")

    def wire_buffer(self, n_elems: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(n_elems, dtype=torch.bfloat16)

    def pack(self, tensors, wire, scale: float = 1.0) -> None:
        """``wire <- bf16(scale * t)`` per tensor: the product in fp32, rounded once."""
        lo = 0
        for t in tensors:
            hi = lo + t.numel()
            wire[lo:hi].copy_(t.reshape(-1) * scale if scale != 1.0 else t.reshape(-1))
            lo = hi

    def unpack(self, wire, tensors) -> None:
        lo = 0
        for t in tensors:
            hi = lo + t.numel()
            t.copy_(wire[lo:hi].view_as(t))
            lo = hi
