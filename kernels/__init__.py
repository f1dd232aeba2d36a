"""Fused multi-tensor kernels for gradient communication and LARS, CUDA with CPU references.

| function                | what it does                                     | used by          |
|-------------------------|--------------------------------------------------|------------------|
| `pack_fp16`             | fp32 tensors x scale -> fp16 buffer + overflow   | fp16 compression |
| `unpack_fp16`           | fp16 buffer x scale -> fp32 tensors (or +=)      | fp16 compression |
| `multi_tensor_sq_norms` | per-tensor sum of squares, global L2 norm        | LARS trust ratio |
| `lars_update`           | LARS momentum step, per-tensor step size         | LARS on CUDA¹    |

¹ ``hpctrain.optim.LARS`` calls it for contiguous fp32 CUDA tensors with momentum where CuPy
runs the kernel (one launch per parameter group instead of ~6 ``_foreach`` kernels per
layer), and keeps torch ``_foreach`` arithmetic elsewhere; ``python -m hpctrain bench kernels``
times it against a plain copy.

Dispatch by array kind: CUDA torch tensors and CuPy arrays run the CuPy kernels (one launch,
in place, on the current stream, no host synchronisation); CPU torch tensors and NumPy arrays
run the torch reference of the same module (NumPy arrays are viewed, not copied, and results
come back as NumPy). CUDA torch tensors without CuPy fall back to the torch reference on the
GPU; `backend()` says which path is live and why. CuPy is the optional extra
`pip install 'hpctrain[cuda]'`; importing this package never needs it.

Installed as ``hpctrain.kernels`` (setup.py's ``package_dir``: this folder is its one home), never
as a top-level ``kernels``, which would collide with the PyPI distribution of that name.
"""
import numbers

from . import _args, _runtime, fp16_pack, fp16_unpack, lars_step, sq_norms
from ._runtime import Array

__all__ = [
    "SOURCES", "backend", "lars_update", "multi_tensor_sq_norms", "pack_fp16", "unpack_fp16",
]

SOURCES = {
    fp16_pack.KERNEL_NAME: fp16_pack.SOURCE,
    fp16_unpack.KERNEL_NAME: fp16_unpack.SOURCE,
    sq_norms.KERNEL_NAME: sq_norms.SOURCE,
    lars_step.KERNEL_NAME: lars_step.SOURCE,
}
"""Every CUDA source by kernel name (compiled offline by tests/kernels/test_compile.py)."""


def backend() -> tuple[str, str]:
    """`("cuda" | "cpu", reason)`: whether CUDA arrays would run the CuPy kernels."""
    cupy, reason = _runtime.probe()
    return ("cuda" if cupy is not None else "cpu"), reason


def _use_cuda(kind) -> bool:
    if kind == "cuda-array":
        _runtime.require_cupy()
        return True
    return kind == "torch-cuda" and _runtime.probe()[0] is not None


def _as_numpy(result, kind) -> Array:
    return result.numpy() if kind == "numpy" else result


def pack_fp16(tensors, out, scale=1.0) -> Array:
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


def unpack_fp16(buf, tensors, scale=1.0, accumulate=False) -> None:
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


def multi_tensor_sq_norms(tensors) -> tuple[Array, Array]:
    """`(per_tensor_sq, global_norm)` of fp32 tensors with fp32 accumulation.

    `per_tensor_sq[i]` is sum(tensors[i] ** 2) (LARS takes its square root); `global_norm` is
    the 0-d L2 norm of all tensors together, sqrt(sum(per_tensor_sq)).
    """
    tensors = list(tensors)
    if not tensors:
        return sq_norms.reference([])
    kind = _args.common_family(tensors, "multi_tensor_sq_norms")
    on_gpu = _use_cuda(kind)
    _args.check_tensors(tensors, "float32", "multi_tensor_sq_norms tensors", dense=True)
    _args.check_one_device(tensors, "multi_tensor_sq_norms")
    if on_gpu:
        return sq_norms.cuda(tensors)
    per_tensor_sq, global_norm = sq_norms.reference([_args.as_torch(t) for t in tensors])
    return _as_numpy(per_tensor_sq, kind), _as_numpy(global_norm, kind)


def _strides(x) -> tuple:
    return tuple(x.stride()) if hasattr(x, "stride") and callable(x.stride) else ()


def lars_update(params, grads, momentum_buffers, step, weight_decay, momentum, nesterov=False) -> None:
    """In place: `u = step[t]*(g + weight_decay*w); v = momentum*v + u; w -= v`
    (nesterov: `w -= u + momentum*v`) for every tensor t.

    `step` is a float or a 1-D fp32 array with one entry per tensor (`lr * trust_ratio`), on
    the tensors' device; all tensors fp32 and dense, `grads[t]` and `momentum_buffers[t]`
    shaped and laid out like `params[t]` (contiguous, or channels_last like a channels_last
    parameter and its bucket's gradient view: the update is element-wise in memory order).
    """
    params, grads, bufs = list(params), list(grads), list(momentum_buffers)
    if not (len(params) == len(grads) == len(bufs)):
        raise ValueError(f"lars_update: {len(params)} params, {len(grads)} grads, "
                         f"{len(bufs)} buffers")
    if not params:
        return
    per_tensor = not isinstance(step, numbers.Real)
    arrays = params + grads + bufs + ([step] if per_tensor else [])
    kind = _args.common_family(arrays, "lars_update")
    on_gpu = _use_cuda(kind)
    for what, group in (("params", params), ("grads", grads), ("momentum_buffers", bufs)):
        _args.check_tensors(group, "float32", f"lars_update {what}", dense=True)
    for i, (p, g, v) in enumerate(zip(params, grads, bufs)):
        if tuple(p.shape) != tuple(g.shape) or tuple(p.shape) != tuple(v.shape):
            raise ValueError(f"lars_update: shapes differ at {i}: {p.shape}, {g.shape}, {v.shape}")
        if not (_args.same_layout(p, g) and _args.same_layout(p, v)):
            raise ValueError(f"lars_update: memory layouts differ at {i} (strides {_strides(p)}, "
                             f"{_strides(g)}, {_strides(v)})")
    if per_tensor:
        _args.check_flat(step, "float32", len(params), "lars_update step")
    _args.check_one_device(arrays, "lars_update")
    if on_gpu:
        lars_step.cuda(params, grads, bufs, step, weight_decay, momentum, nesterov)
        return
    to_torch = _args.as_torch
    lars_step.reference([to_torch(p) for p in params], [to_torch(g) for g in grads],
                        [to_torch(v) for v in bufs], to_torch(step) if per_tensor else step,
                        weight_decay, momentum, nesterov)
