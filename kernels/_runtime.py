"""CuPy plumbing: find CuPy, compile each kernel once, launch on the caller's stream.

CuPy is an optional extra (`pip install 'hpctrain[cuda]'`); nothing here imports it until a
GPU array is seen or `probe()` is called. Inputs are passed to kernels as raw device addresses,
so torch CUDA tensors and CuPy arrays are used in place (zero copy) and no stream
synchronisation is implied (CuPy's `__cuda_array_interface__` import may synchronise, raw
addresses never do). Kernels run on torch's current stream for torch inputs and on CuPy's
current stream for CuPy inputs, so they are ordered after the work that produced the inputs.
Compile-once caching follows ChainerMN's `pure_nccl_communicator.py` (kernels built on first use).

CuPy versions: CuPy 12, 13 and 14, built for CUDA 12 (`cupy-cuda12x`) or CUDA 13
(`cupy-cuda13x`, CuPy >= 13.6). The calls used here exist in all of them (`RawModule(code=,
options=)`, `cuda.runtime.getDeviceCount`/`runtimeGetVersion`, `cuda.Device`,
`get_current_stream().ptr`); the one difference, how a torch stream becomes a CuPy stream, is
decided in `_cupy_view_of`. No DLPack hop is used (raw addresses), so `cupy.from_dlpack` /
`fromDlpack` differences do not arise. Older CuPy is reported by `probe()` as unusable.
"""
import collections
import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ._prelude import BLOCK_THREADS
from ._table import build_table

INSTALL_HINT = ("pip install 'hpctrain[cuda]' (cupy-cuda12x, CUDA 12 drivers) or "
                "'hpctrain[cuda13]' (cupy-cuda13x, CUDA 13 drivers)")
MIN_CUPY_MAJOR = 12
_TABLE_CACHE_LEN = 512

Array = Any
"""A torch tensor, NumPy array or CuPy array, as the kernels take and return them (CuPy has no
type stubs, so to mypy the union is Any)."""


def cupy_major(version: str) -> int:
    """The major of a CuPy version string ("14.2.0", "13.6.0rc1", "12.3.0+cuda12"); 0 if unreadable."""
    head = str(version).split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def cuda_runtime_version(cupy) -> str:
    """The CUDA runtime CuPy was built for, "12.4" (runtimeGetVersion's 12040); "unknown" if it
    cannot say."""
    try:
        v = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:  # an API or driver difference: only the description loses the number
        return "unknown"
    return f"{v // 1000}.{v % 1000 // 10}"


@functools.lru_cache(maxsize=1)
def probe() -> tuple[Any, str]:
    """Return `(cupy module or None, reason)`; never raises, never prints."""
    try:
        import cupy
    except ImportError:
        return None, f"cupy not installed; {INSTALL_HINT}"
    if cupy_major(cupy.__version__) < MIN_CUPY_MAJOR:
        return None, f"cupy {cupy.__version__} is older than {MIN_CUPY_MAJOR}; {INSTALL_HINT}"
    try:
        usable = cupy.is_available()
    except Exception as exc:  # driver/runtime errors: reported through the reason, not hidden
        return None, f"cupy {cupy.__version__} cannot query CUDA: {type(exc).__name__}: {exc}"
    if not usable:
        return None, (f"cupy {cupy.__version__} installed but no CUDA device "
                      "(cupy.is_available() is False)")
    n_devices = cupy.cuda.runtime.getDeviceCount()
    failed = nvrtc_failure(cupy)
    if failed:
        return None, f"cupy {cupy.__version__} cannot compile kernels ({failed}): torch path"
    return cupy, f"cupy {cupy.__version__} (CUDA {cuda_runtime_version(cupy)}), {n_devices} CUDA device(s)"


PROBE_SOURCE = 'extern "C" __global__ void hpc_probe(float* x) { x[threadIdx.x] += 1.0f; }'


def nvrtc_failure(cupy) -> str:
    """Compile a one-line kernel with NVRTC, the way :func:`function` compiles the real ones;
    "" if that works, else the error in one line. ``cupy.is_available()`` only asks for a
    device: a CuPy whose NVRTC library is missing or too old for the driver passes it and then
    fails at the first kernel compile, mid-run. Asked once, by :func:`probe`."""
    try:
        cupy.RawModule(code=PROBE_SOURCE, options=("-std=c++17",)).get_function("hpc_probe")
    except Exception as exc:  # NVRTCError, CompileException, a missing libnvrtc: one line
        text = " ".join(str(exc).split())
        return f"NVRTC compile failed: {type(exc).__name__}: {text[:160]}"
    return ""


def require_cupy() -> Any:
    """CuPy, or ImportError naming the extra to install."""
    cupy, reason = probe()
    if cupy is None:
        raise ImportError(f"CUDA arrays need CuPy: {reason}")
    return cupy


_FUNCTIONS: dict[tuple[str, int], object] = {}    # (name, device id) -> cupy RawKernel


def function(source, name) -> Any:
    """The compiled kernel `name` from `source` for the current device, compiled once."""
    cupy = require_cupy()
    key = (name, cupy.cuda.Device().id)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        module = cupy.RawModule(code=source, options=("-std=c++17",))
        fn = _FUNCTIONS[key] = module.get_function(name)
    return fn


def is_cuda_array(x) -> bool:
    """A CUDA tensor or a CuPy (or other `__cuda_array_interface__`) array."""
    if isinstance(x, torch.Tensor):
        return x.is_cuda
    return hasattr(x, "__cuda_array_interface__")


def address(x) -> int:
    return x.data_ptr() if isinstance(x, torch.Tensor) else x.data.ptr


def n_elems(x) -> int:
    return x.numel() if isinstance(x, torch.Tensor) else int(x.size)


def device_id(x) -> int:
    return x.device.index if isinstance(x, torch.Tensor) else x.device.id


@contextlib.contextmanager
def launch_scope(sample) -> Iterator[Any]:
    """Make `sample`'s device current and, for torch, torch's current stream CuPy's stream."""
    cupy = require_cupy()
    dev = device_id(sample)
    with cupy.cuda.Device(dev):
        if isinstance(sample, torch.Tensor):
            with _cupy_view_of(torch.cuda.current_stream(sample.device), dev):
                yield cupy
        else:
            yield cupy


def _cupy_view_of(torch_stream, dev, cupy=None) -> Any:
    """A CuPy stream for a torch stream: the CUDA stream protocol where both sides have it
    (CuPy >= 14 `Stream.from_external`, torch's `__cuda_stream__`), else `ExternalStream(ptr,
    device)` (CuPy 12 and 13; deprecated in 14, still there)."""
    if cupy is None:
        import cupy as cupy_module
        cupy = cupy_module

    if hasattr(cupy.cuda.Stream, "from_external") and hasattr(torch_stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(torch_stream)
    external = getattr(cupy.cuda, "ExternalStream", None)
    if external is None:
        raise RuntimeError(f"cupy {cupy.__version__} has neither Stream.from_external (with a torch stream "
                           "that has __cuda_stream__) nor ExternalStream: cannot launch on torch's stream")
    return external(torch_stream.cuda_stream, dev)


class TableCache:
    """Device tables and address arrays by key, least recently used out first.

    Why LRU and why this size: the keys hold buffer addresses, and gradient buffers alternate
    between two addresses from step to step (double-buffered buckets), so a step touches about
    twice as many keys as it has tables: a 32-entry FIFO, with fp16 staging and LARS over five
    or more buckets, would evict each table just before its next use and miss every lookup. Each
    entry is a few hundred bytes of device memory; ``hits``/``misses`` count lookups (the tests
    assert a warm step misses nothing)."""

    def __init__(self, capacity: int = _TABLE_CACHE_LEN):
        self.capacity, self.hits, self.misses = capacity, 0, 0
        self._entries: collections.OrderedDict[tuple, Any] = collections.OrderedDict()

    def get(self, key: tuple, make) -> Any:
        hit = self._entries.get(key)
        if hit is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return hit
        self.misses += 1
        hit = self._entries[key] = make()
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return hit

    def __len__(self) -> int:
        return len(self._entries)


_TABLES = TableCache()     # key -> (table, n_chunks) or an address array


def device_table(tensors) -> tuple[Any, int]:
    """`(device int64 table, n_chunks)` for `tensors`; call inside `launch_scope`.

    Cached by (device, stream, addresses, sizes) in :data:`_TABLES`: gradient buffers are
    stable across steps (two per bucket, alternating), so each host-to-device copy happens
    once. The stream is in the key because the upload is ordered on the stream it was made on.
    """
    cupy = require_cupy()
    addrs = tuple(address(t) for t in tensors)
    sizes = tuple(n_elems(t) for t in tensors)
    key = ("table", cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr, addrs, sizes)

    def make():
        table, n_chunks = build_table(addrs, sizes)
        return cupy.asarray(table), n_chunks
    return _TABLES.get(key, make)


def device_addresses(arrays) -> Any:
    """Device int64 array of the arrays' addresses (cached like `device_table`)."""
    cupy = require_cupy()
    addrs = tuple(address(a) for a in arrays)
    key = ("addresses", cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr, addrs)
    return _TABLES.get(key, lambda: cupy.asarray(np.asarray(addrs, dtype=np.uint64).view(np.int64)))


def launch(fn, n_blocks, args) -> None:
    """Launch `fn` with one block per chunk on the current CuPy stream (no-op for 0 blocks)."""
    if n_blocks > 0:
        fn((n_blocks,), (BLOCK_THREADS,), args)


def ptr_arg(x) -> np.uint64:
    return np.uint64(address(x))


def zeros(like, shape, dtype) -> Array:
    """Zeroed device array in `like`'s type (torch or CuPy) on its device and current stream.

    Results are allocated by the caller's library, so they come back without a DLPack hop and
    are freed in stream order by that library's caching allocator.
    """
    if isinstance(like, torch.Tensor):
        return torch.zeros(shape, dtype=getattr(torch, dtype), device=like.device)
    return require_cupy().zeros(shape, dtype=dtype)
