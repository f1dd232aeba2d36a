"""A wire codec in one file: bfloat16 gradients on the wire (``comm.compression``).

Select it without editing the package: ``--set comm.compression=examples.plugins.bf16_codec:bf16``
(from the repository root, which ``python -m hpctrain`` puts on ``sys.path``).

Half the bytes, like ``fp16``, but with fp32's exponent range: a pre-divided gradient or a partial
sum never overflows where fp32 would not, at 8 mantissa bits (relative error ~(n+1) 2^-8 for n
ranks, eight times fp16's). Accumulation is fp16's: each pair of operands is widened into fp32
scratch, added there and rounded once (:class:`~hpctrain.comm.compression.FP16Compression`'s
``reduce`` does not depend on the wire dtype) and packing is :class:`NoCompression`'s copy into a
buffer of another dtype, so only the format itself is written here.
"""
from __future__ import annotations

import torch

from hpctrain.comm.compression import COMPRESSIONS, FP16Compression, NoCompression


@COMPRESSIONS.register("bf16")
class BF16Compression(FP16Compression):
    def check_dtype(self, dtype: torch.dtype) -> None:
        if dtype != torch.float32:
            raise ValueError(f"comm.compression: bf16 needs float32 gradients, got {dtype} (use compression 'none')")

    def wire_buffer(self, n_elems: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(n_elems, dtype=torch.bfloat16)

    # Gradients <-> wire as plain dtype-converting copies: NoCompression's own loops (torch.mul
    # into the bf16 buffer computes in fp32 and rounds once).
    pack = NoCompression.pack
    unpack = NoCompression.unpack
