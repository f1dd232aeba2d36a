"""multi_tensor_sq_norms: per-tensor sums of squares and the global L2 norm, fp32 accumulation.

LARS [You et al. 2017] needs ||w|| and ||g|| per layer; gradient clipping needs the global norm.
The CUDA kernel does it in one launch and deterministically: each block writes its chunk's
partial sum, and the last block to finish (threadfence + atomic counter, the CUDA sample
`threadFenceReduction` pattern) adds the partials of each tensor in a fixed order.
"""
import numpy as np
import torch

from . import _runtime
from ._prelude import PRELUDE
from ._runtime import Array

KERNEL_NAME = "hpc_sq_norms"

SOURCE = PRELUDE + r"""
extern "C" __global__ void hpc_sq_norms(const hpc_i64* table, int n_tensors, int n_chunks,
                                        float* partial, unsigned int* blocks_done,
                                        float* per_tensor_sq, float* global_norm) {
    __shared__ float scratch[32];
    __shared__ int is_last;
    HpcChunk k = hpc_chunk(table, n_tensors, blockIdx.x);
    const float* src = (const float*)(hpc_u64)table[k.tensor];
    float acc = 0.0f;
    for (hpc_i64 i = k.begin + threadIdx.x; i < k.end; i += blockDim.x) {
        float v = src[i];
        acc = fmaf(v, v, acc);
    }
    acc = hpc_block_sum(acc, scratch);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = acc;
        __threadfence();
        is_last = atomicAdd(blocks_done, 1u) == (unsigned int)(n_chunks - 1);
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    const volatile float* done = partial;
    float total = 0.0f;
    for (int t = threadIdx.x; t < n_tensors; t += blockDim.x) {
        hpc_i64 first = table[3LL * n_tensors + t];
        hpc_i64 count = (table[2LL * n_tensors + t] + HPC_CHUNK - 1) / HPC_CHUNK;
        float s = 0.0f;
        for (hpc_i64 c = 0; c < count; ++c) s += done[first + c];
        per_tensor_sq[t] = s;
        total += s;
    }
    total = hpc_block_sum(total, scratch);
    if (threadIdx.x == 0) *global_norm = sqrtf(total);
}
"""


@torch.no_grad()
def reference(tensors) -> tuple[torch.Tensor, torch.Tensor]:
    """torch reference (any device): `(per_tensor_sq float32[n], global_norm float32 0-d)`."""
    if not tensors:
        return torch.zeros(0, dtype=torch.float32), torch.zeros((), dtype=torch.float32)
    per_tensor_sq = torch.stack([torch.dot(v, v) for v in (t.reshape(-1) for t in tensors)])
    return per_tensor_sq, per_tensor_sq.sum().sqrt()


def cuda(tensors) -> tuple[Array, Array]:
    """One launch; results on the tensors' device in the caller's array type."""
    sample = tensors[0]
    with _runtime.launch_scope(sample):
        table, n_chunks = _runtime.device_table(tensors)
        per_tensor_sq = _runtime.zeros(sample, (len(tensors),), "float32")
        global_norm = _runtime.zeros(sample, (), "float32")
        if n_chunks:
            partial = _runtime.zeros(sample, (n_chunks,), "float32")
            blocks_done = _runtime.zeros(sample, (1,), "int32")
            fn = _runtime.function(SOURCE, KERNEL_NAME)
            ptr = _runtime.ptr_arg
            _runtime.launch(fn, n_chunks, (table, np.int32(len(tensors)), np.int32(n_chunks),
                                           ptr(partial), ptr(blocks_done), ptr(per_tensor_sq),
                                           ptr(global_norm)))
    return per_tensor_sq, global_norm
