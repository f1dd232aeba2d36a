"""unpack_fp16: one fp16 buffer -> many fp32 tensors, times `scale`, optionally accumulated.

The inverse of `fp16_pack`: the caller passes the inverse scale (e.g. 1 / (loss_scale * world)).
Values are widened to fp32 before the multiply; with `accumulate=True` the result is added to
the tensors' current values in fp32 (a mixed-dtype fp32 += fp16 `add_` is several times slower than
converting first: docs/environment.md).
"""
import numpy as np
import torch

from . import _runtime
from ._prelude import PRELUDE
from ._segments import segments

KERNEL_NAME = "hpc_unpack_fp16"

SOURCE = PRELUDE + r"""
extern "C" __global__ void hpc_unpack_fp16(const hpc_i64* table, int n_tensors,
                                           const unsigned short* buf, float scale,
                                           int accumulate) {
    HpcChunk k = hpc_chunk(table, n_tensors, blockIdx.x);
    float* dst = (float*)(hpc_u64)table[k.tensor];
    const unsigned short* src = buf + table[n_tensors + k.tensor];
    for (hpc_i64 i = k.begin + threadIdx.x; i < k.end; i += blockDim.x) {
        float v = hpc_f16_to_f32(src[i]);
        dst[i] = accumulate ? __fmaf_rn(v, scale, dst[i]) : v * scale;
    }
}
"""

CHUNK_ELEMS_CPU = 1 << 17
"""Elements per step on CPU: the scratch / destination chunk stays in L2 between passes."""


@torch.no_grad()
def reference(buf, tensors, scale, accumulate=False) -> None:
    """torch reference (any device); writes `tensors` in place and returns None."""
    scale = float(scale)
    scratch = torch.empty(min(CHUNK_ELEMS_CPU, buf.numel()), dtype=torch.float32, device=buf.device)
    for offset, n, parts in segments(tensors, CHUNK_ELEMS_CPU):
        src = buf[offset:offset + n]
        if len(parts) == 1 and not accumulate:
            dst = parts[0]
            dst.copy_(src)
            if scale != 1.0:
                dst.mul_(scale)
            continue
        widened = scratch[:n]
        widened.copy_(src)  # fp16 -> fp32 first: a mixed-dtype add_ is several times slower
        pieces = [widened]
        if len(parts) > 1:
            pieces = list(torch.split(widened, [p.numel() for p in parts]))
        if accumulate:
            torch._foreach_add_(parts, pieces, alpha=scale)
        else:  # a run of small tensors: scale once, scatter with one call
            widened.mul_(scale)
            torch._foreach_copy_(parts, pieces)


def cuda(buf, tensors, scale, accumulate=False) -> None:
    """One launch for all tensors, on the caller's stream; returns None."""
    with _runtime.launch_scope(buf):
        table, n_chunks = _runtime.device_table(tensors)
        fn = _runtime.function(SOURCE, KERNEL_NAME)
        _runtime.launch(fn, n_chunks, (table, np.int32(len(tensors)), _runtime.ptr_arg(buf),
                                       np.float32(scale), np.int32(bool(accumulate))))
