"""unpack_fp16: one fp16 buffer -> many fp32 tensors, times `scale`, optionally accumulated.

The inverse of `fp16_pack`: the caller passes the inverse scale (e.g. 1 / (loss_scale * world)).
Values are widened to fp32 before the multiply; with `accumulate=True` the result is added to
the tensors' current values in fp32 (DESIGN.md: a mixed-dtype fp32 += fp16 `add_` is 6x slower
than converting first).
"""
import numpy as np
import torch

from . import _runtime
from ._prelude import PRELUDE

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
def reference(buf, tensors, scale, accumulate=False):
    """torch reference (any device); writes `tensors` in place and returns None."""
    scale = float(scale)
    largest = max((t.numel() for t in tensors), default=0)
    scratch = None
    if accumulate and largest:
        scratch = torch.empty(min(largest, CHUNK_ELEMS_CPU), dtype=torch.float32, device=buf.device)
    offset = 0
    for t in tensors:
        dst = t.view(-1)
        n = dst.numel()
        src = buf[offset:offset + n]
        offset += n
        if not accumulate and scale == 1.0:
            dst.copy_(src)
            continue
        for begin in range(0, n, CHUNK_ELEMS_CPU):
            end = min(begin + CHUNK_ELEMS_CPU, n)
            if accumulate:
                tmp = scratch[:end - begin]
                tmp.copy_(src[begin:end])
                dst[begin:end].add_(tmp, alpha=scale)
            else:
                part = dst[begin:end]
                part.copy_(src[begin:end])
                part.mul_(scale)


def cuda(buf, tensors, scale, accumulate=False):
    """One launch for all tensors, on the caller's stream; returns None."""
    with _runtime.launch_scope(buf):
        table, n_chunks = _runtime.device_table(tensors)
        fn = _runtime.function(SOURCE, KERNEL_NAME)
        _runtime.launch(fn, n_chunks, (table, np.int32(len(tensors)), _runtime.ptr_arg(buf),
                                       np.float32(scale), np.int32(bool(accumulate))))
