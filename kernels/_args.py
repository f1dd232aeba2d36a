"""Argument checks shared by the dispatchers: one family of arrays, dtypes, contiguity, sizes.

Checks read only host-side metadata (dtype, shape, device), so they never synchronise a GPU.
"""
import numpy as np
import torch

from . import _runtime
from ._runtime import Array


def family(x) -> str:
    """'torch' (CPU tensor), 'torch-cuda', 'numpy' or 'cuda-array' (CuPy and alike)."""
    if isinstance(x, torch.Tensor):
        return "torch-cuda" if x.is_cuda else ("torch" if x.device.type == "cpu" else x.device.type)
    if isinstance(x, np.ndarray):
        return "numpy"
    if _runtime.is_cuda_array(x):
        return "cuda-array"
    raise TypeError(f"expected a torch tensor, NumPy or CuPy array, got {type(x).__name__}")


def common_family(arrays, what) -> str:
    if all(isinstance(a, torch.Tensor) for a in arrays):  # fast path: one device query per device
        kinds = {family(a) for a in {a.device: a for a in arrays}.values()}
    else:
        kinds = {family(a) for a in arrays}
    if len(kinds) > 1:
        raise TypeError(f"{what}: mixed array kinds {sorted(kinds)}; pass one kind")
    return kinds.pop()


def dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


def check_dtype(x, name, what) -> None:
    if dtype_name(x) != name:
        raise TypeError(f"{what} must be {name}, got {dtype_name(x)}")


def is_contiguous(x) -> bool:
    return x.is_contiguous() if isinstance(x, torch.Tensor) else bool(x.flags.c_contiguous)


def is_dense(x) -> bool:
    """Do ``x``'s elements fill one block of memory without gaps or overlaps, in some order
    (contiguous, channels_last, any permutation of a contiguous tensor)? An element-wise kernel
    over ``numel`` elements from the first address then touches exactly ``x``'s elements."""
    if not isinstance(x, torch.Tensor):
        return is_contiguous(x)
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(x.stride(), x.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def same_layout(a, b) -> bool:
    """Element i of ``a`` and of ``b`` at the same offset in memory: both dense, equal strides
    (size-1 dimensions aside). What an element-wise kernel over several tensors needs."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return is_contiguous(a) and is_contiguous(b)
    if a.is_contiguous() and b.is_contiguous():
        return True
    strides = [(sa, sb) for sa, sb, sz in zip(a.stride(), b.stride(), a.shape) if sz != 1]
    return is_dense(a) and is_dense(b) and all(sa == sb for sa, sb in strides)


_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def check_tensors(tensors, dtype, what, dense: bool = False) -> None:
    """dtype, and contiguity (``dense``: any dense layout, for kernels that do not care about
    the order of elements, e.g. norms, or that take several tensors of one layout)."""
    want = _TORCH_DTYPES[dtype]
    for i, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and t.dtype is want and t.is_contiguous():
            continue  # fast path for the common case
        check_dtype(t, dtype, f"{what}[{i}]")
        if not (is_dense(t) if dense else is_contiguous(t)):
            raise ValueError(f"{what}[{i}] must be {'dense' if dense else 'contiguous'}")


def check_flat(buf, dtype, total, what) -> None:
    check_dtype(buf, dtype, what)
    if len(buf.shape) != 1 or not is_contiguous(buf):
        raise ValueError(f"{what} must be a contiguous 1-D array, got shape {tuple(buf.shape)}")
    if _runtime.n_elems(buf) != total:
        raise ValueError(f"{what} has {_runtime.n_elems(buf)} elements, tensors hold {total}")


def check_one_device(arrays, what) -> None:
    found = {a.device if isinstance(a, torch.Tensor) else str(a.device)  # CuPy: by name
             for a in arrays if hasattr(a, "device")}
    devices = {str(d) for d in found}
    if len(devices) > 1:
        raise ValueError(f"{what}: arrays on several devices {sorted(devices)}")


def total_elems(tensors) -> int:
    return sum(_runtime.n_elems(t) for t in tensors)


def as_torch(x) -> Array:
    """Zero-copy torch view of a NumPy array (torch tensors pass through)."""
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x
