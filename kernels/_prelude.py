"""CUDA text shared by every kernel: fp16 conversion, the multi-tensor table, block reduction.

The multi-tensor table follows apex's `multi_tensor_apply` idea (each thread block works on one
fixed-size chunk of one tensor, so a single launch covers any list of tensors), but the table
lives in device memory (built by `kernels._table.build_table`) instead of kernel parameters,
so there is no 4 KiB parameter limit and no per-110-tensor relaunch.

fp16 is handled as raw `unsigned short` bits with PTX `cvt` instructions, so the sources need no
header (`cuda_fp16.h`) and compile with bare NVRTC, without a GPU and without include paths.
"""

CHUNK_ELEMS = 16384
"""Elements per thread block; one table entry per (tensor, chunk)."""

BLOCK_THREADS = 256

PRELUDE = r"""
#define HPC_CHUNK %(chunk)dLL
typedef long long hpc_i64;
typedef unsigned long long hpc_u64;

/* Round-to-nearest-even fp32 -> fp16, as torch's copy_ and NumPy's astype. */
__device__ __forceinline__ unsigned short hpc_f32_to_f16(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %%0, %%1;" : "=h"(h) : "f"(x));
    return h;
}

__device__ __forceinline__ float hpc_f16_to_f32(unsigned short h) {
    float x;
    asm("cvt.f32.f16 %%0, %%1;" : "=f"(x) : "h"(h));
    return x;
}

/* Exponent all ones: inf or NaN. */
__device__ __forceinline__ int hpc_f16_nonfinite(unsigned short h) {
    return (h & 0x7C00u) == 0x7C00u;
}

/* Table layout (int64 words, n = number of tensors, see kernels/_table.py):
 *   [0, n)      device address of each tensor
 *   [n, 2n)     element offset of each tensor in the flat buffer
 *   [2n, 3n)    element count of each tensor
 *   [3n, 4n)    index of each tensor's first chunk
 *   [4n, 4n+c)  chunk entry: (tensor index << 32) | chunk index inside that tensor
 */
struct HpcChunk {
    int tensor;
    hpc_i64 begin;
    hpc_i64 end;
};

__device__ __forceinline__ HpcChunk hpc_chunk(const hpc_i64* table, int n_tensors, int c) {
    hpc_i64 entry = table[4LL * n_tensors + c];
    HpcChunk k;
    k.tensor = (int)(entry >> 32);
    k.begin = (entry & 0xFFFFFFFFLL) * HPC_CHUNK;
    hpc_i64 n = table[2LL * n_tensors + k.tensor];
    k.end = k.begin + HPC_CHUNK < n ? k.begin + HPC_CHUNK : n;
    return k;
}

/* Sum over the block; every thread gets the result. Fixed order, so deterministic. */
__device__ __forceinline__ float hpc_block_sum(float v, float* scratch32) {
    for (int s = 16; s > 0; s >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, s);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch32[warp] = v;
    __syncthreads();
    int n_warps = (blockDim.x + 31) >> 5;
    v = threadIdx.x < n_warps ? scratch32[threadIdx.x] : 0.0f;
    if (warp == 0) {
        for (int s = 16; s > 0; s >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, s);
        if (lane == 0) scratch32[0] = v;
    }
    __syncthreads();
    v = scratch32[0];
    __syncthreads();
    return v;
}
""" % {"chunk": CHUNK_ELEMS}  # noqa: UP031 (C braces: %-format, not str.format)
