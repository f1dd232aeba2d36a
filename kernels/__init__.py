"""Fused multi-tensor kernels for gradient communication and LARS, CUDA with CPU references.

| function                | what it does                                            | used by          |
|-------------------------|---------------------------------------------------------|------------------|
| `pack_fp16`             | fp32 tensors x scale -> one fp16 buffer, overflow flag  | fp16 compression |
| `unpack_fp16`           | fp16 buffer x scale -> fp32 tensors (or += into them)   | fp16 compression |
| `multi_tensor_sq_norms` | per-tensor sum of squares and global L2 norm            | LARS, clipping   |

Dispatch by array kind: CUDA torch tensors and CuPy arrays run the CuPy kernels (one launch,
in place, on the current stream, no host synchronisation); CPU torch tensors and NumPy arrays
run the torch reference of the same module (NumPy arrays are viewed, not copied, and results
come back as NumPy). CUDA torch tensors without CuPy fall back to the torch reference on the
GPU; `backend()` says which path is live and why. CuPy is the optional extra
`pip install 'hpctrain[cuda]'`; importing this package never needs it.
"""
from . import _args, _runtime, fp16_pack, fp16_unpack, sq_norms

__all__ = ["SOURCES", "backend", "multi_tensor_sq_norms", "pack_fp16", "unpack_fp16"]

SOURCES = {
    fp16_pack.KERNEL_NAME: fp16_pack.SOURCE,
    fp16_unpack.KERNEL_NAME: fp16_unpack.SOURCE,
    sq_norms.KERNEL_NAME: sq_norms.SOURCE,
}
"""Every CUDA source by kernel name (compiled offline by tests/kernels/test_compile.py)."""


def backend():
    """`("cuda" | "cpu", reason)`: whether CUDA arrays would run the CuPy kernels."""
    cupy, reason = _runtime.probe()
    return ("cuda" if cupy is not None else "cpu"), reason


def _use_cuda(kind):
    if kind == "cuda-array":
        _runtime.require_cupy()
        return True
    return kind == "torch-cuda" and _runtime.probe()[0] is not None


def _as_numpy(result, kind):
    return result.numpy() if kind == "numpy" else result


def pack_fp16(tensors, out, scale=1.0):
    """Write `tensors` (fp32, contiguous) x `scale` into `out` (fp16, 1-D, length = total).

    Scaling happens in fp32 before rounding. Returns the overflow flag: a 0-d bool array on
    `out`'s device, True if `out` holds any inf/NaN. Reading it (`bool(flag)`) is the caller's
    choice of when to synchronise.
    """
    tensors = list(tensors)
    kind = _args.common_family(tensors + [out], "pack_fp16")
    on_gpu = _use_cuda(kind)
    _args.check_tensors(tensors, "float32", "pack_fp16 tensors")
    _args.check_flat(out, "float16", _args.total_elems(tensors), "pack_fp16 out")
    _args.check_one_device(tensors + [out], "pack_fp16")
    if on_gpu:
        return fp16_pack.cuda(tensors, out, scale)
    flag = fp16_pack.reference([_args.as_torch(t) for t in tensors], _args.as_torch(out), scale)
    return _as_numpy(flag, kind)


def unpack_fp16(buf, tensors, scale=1.0, accumulate=False):
    """Write `buf` (fp16, 1-D) x `scale` into `tensors` (fp32, contiguous), in place.

    With `accumulate=True` the scaled values are added to the tensors' contents instead.
    """
    tensors = list(tensors)
    kind = _args.common_family(tensors + [buf], "unpack_fp16")
    on_gpu = _use_cuda(kind)
    _args.check_tensors(tensors, "float32", "unpack_fp16 tensors")
    _args.check_flat(buf, "float16", _args.total_elems(tensors), "unpack_fp16 buf")
    _args.check_one_device(tensors + [buf], "unpack_fp16")
    if on_gpu:
        fp16_unpack.cuda(buf, tensors, scale, accumulate)
        return
    fp16_unpack.reference(_args.as_torch(buf), [_args.as_torch(t) for t in tensors], scale,
                          accumulate)


def multi_tensor_sq_norms(tensors):
    """`(per_tensor_sq, global_norm)` of fp32 tensors with fp32 accumulation.

    `per_tensor_sq[i]` is sum(tensors[i] ** 2) (LARS takes its square root); `global_norm` is
    the 0-d L2 norm of all tensors together, sqrt(sum(per_tensor_sq)).
    """
    tensors = list(tensors)
    if not tensors:
        return sq_norms.reference([])
    kind = _args.common_family(tensors, "multi_tensor_sq_norms")
    on_gpu = _use_cuda(kind)
    _args.check_tensors(tensors, "float32", "multi_tensor_sq_norms tensors")
    _args.check_one_device(tensors, "multi_tensor_sq_norms")
    if on_gpu:
        return sq_norms.cuda(tensors)
    per_tensor_sq, global_norm = sq_norms.reference([_args.as_torch(t) for t in tensors])
    return _as_numpy(per_tensor_sq, kind), _as_numpy(global_norm, kind)
