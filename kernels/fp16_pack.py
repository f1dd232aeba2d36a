"""pack_fp16: many fp32 tensors -> one contiguous fp16 buffer, scaled, with an overflow flag.

Used by FP16 gradient compression (torch `fp16_compress_hook`, Horovod `Compression.fp16`) and
dynamic loss scaling: each value is multiplied by `scale` in fp32 *before* rounding to fp16,
so a value that only overflows after scaling is flagged and one that `scale < 1` brings into
range is not. The flag is "any inf/NaN in `out`" (|x * scale| >= 65520 rounds to inf), stays on
the device, and costs no host synchronisation.
"""
from collections.abc import Iterator

import numpy as np
import torch

from . import _runtime
from ._prelude import PRELUDE
from ._runtime import Array
from ._segments import segments

KERNEL_NAME = "hpc_pack_fp16"

SOURCE = PRELUDE + r"""
extern "C" __global__ void hpc_pack_fp16(const hpc_i64* table, int n_tensors,
                                         unsigned short* out, float scale,
                                         unsigned char* flag) {
    HpcChunk k = hpc_chunk(table, n_tensors, blockIdx.x);
    const float* src = (const float*)(hpc_u64)table[k.tensor];
    unsigned short* dst = out + table[n_tensors + k.tensor];
    int bad = 0;
    for (hpc_i64 i = k.begin + threadIdx.x; i < k.end; i += blockDim.x) {
        unsigned short h = hpc_f32_to_f16(src[i] * scale);
        dst[i] = h;
        bad |= hpc_f16_nonfinite(h);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}
"""

CHUNK_ELEMS_CPU = 1 << 17
"""Elements scaled per step: the fp32 scratch (512 KiB) stays in L2 between the multiply, the
fp16 cast and the overflow test, so each input byte crosses memory once."""

SAFE_SQ_SUM = 0.5 * 65520.0**2
"""A chunk whose fp32 sum of squares is below this cannot hold |v| >= 65520 (the fp16 overflow
threshold under round-to-nearest-even), even allowing 50% rounding error in the sum (the real
error is below n * 2**-24 < 1% for a chunk). NaN and inf sums fail the test too."""


def nonfinite_flag(buf) -> torch.Tensor:
    """0-d bool tensor: does `buf` hold inf or NaN? One read pass, no host sync.

    `aminmax` propagates NaN and sees both infinities; on CPU fp16 it is far faster than
    `isfinite(buf).all()`, which materialises a bool tensor (measurements: docs/environment.md).
    """
    if buf.numel() == 0:
        return torch.zeros((), dtype=torch.bool, device=buf.device)
    lo, hi = torch.aminmax(buf)
    return ~(torch.isfinite(lo) & torch.isfinite(hi))


def _pack_chunks(tensors, out, scale) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Write `out` segment by segment; yield each `(scaled fp32 values, fp16 values)` written."""
    scratch = torch.empty(min(CHUNK_ELEMS_CPU, out.numel()), dtype=torch.float32, device=out.device)
    for offset, n, parts in segments(tensors, CHUNK_ELEMS_CPU):
        tmp = scratch[:n]
        if len(parts) > 1:  # a run of small tensors: gather once, then scale in place
            scaled = torch.cat(parts, out=tmp)
            if scale != 1.0:
                scaled.mul_(scale)
        elif scale != 1.0:  # scale in fp32, then round: overflow is judged after scaling
            scaled = torch.mul(parts[0], scale, out=tmp)
        else:
            scaled = parts[0]
        packed = out[offset:offset + n]
        packed.copy_(scaled)  # vectorised fp32 -> fp16 rounding (NumPy's astype is scalar)
        yield scaled, packed


@torch.no_grad()
def reference(tensors, out, scale) -> torch.Tensor:
    """torch reference (any device): returns a 0-d bool tensor on `out`'s device.

    On the CPU each chunk is screened while in cache with one BLAS `dot` (sum of squares below
    `SAFE_SQ_SUM` proves it finite); only a chunk failing the screen is tested exactly for
    inf/NaN in its fp16 values. Elsewhere the whole buffer is tested once, on the device.
    """
    scale = float(scale)
    chunks = _pack_chunks(tensors, out, scale)
    if out.device.type != "cpu":
        for _ in chunks:
            pass
        return nonfinite_flag(out)
    overflow = False
    for scaled, packed in chunks:
        if not overflow and not float(torch.dot(scaled, scaled)) < SAFE_SQ_SUM:
            overflow = bool(nonfinite_flag(packed))
    return torch.tensor(overflow)


def cuda(tensors, out, scale) -> Array:
    """One launch for all tensors; returns a 0-d bool array on `out`'s device."""
    with _runtime.launch_scope(out):
        flag = _runtime.zeros(out, (), "bool")
        table, n_chunks = _runtime.device_table(tensors)
        fn = _runtime.function(SOURCE, KERNEL_NAME)
        _runtime.launch(fn, n_chunks, (table, np.int32(len(tensors)), _runtime.ptr_arg(out),
                                       np.float32(scale), _runtime.ptr_arg(flag)))
    return flag
