"""Horovod's gradient compressors: ``compress(t) -> (t', ctx)`` and ``decompress(t', ctx)``.

For tensor collectives they act as in Horovod. ``DistributedOptimizer`` maps them onto
hpctrain's wire codecs instead (``Compression.fp16`` -> the fp16 wire: pre-divided, fp32
accumulation, only what crosses the network is compressed; :mod:`hpctrain.comm.compression`).
"""
from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """Interface for compressing and decompressing a tensor (Horovod's)."""

    @staticmethod
    def compress(tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    wire = "none"

    @staticmethod
    def compress(tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as fp16."""

    wire = "fp16"

    @staticmethod
    def compress(tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx) -> torch.Tensor:
        return tensor.type(ctx) if ctx is not None and ctx.is_floating_point else tensor


class Compression:
    """``Compression.none`` / ``Compression.fp16``, as in Horovod."""

    none = NoneCompressor
    fp16 = FP16Compressor
