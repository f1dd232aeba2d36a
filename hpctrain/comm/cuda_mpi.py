"""What the CUDA driver and the MPI library are asked about device memory (used by the staging
seam, :mod:`hpctrain.comm.staging`; nothing else imports it).

* :class:`HostRegistry`: page-locks host memory the CUDA driver did not allocate (the MPI-3
  shared window of ``hierarchical``) with ``cudaHostRegister`` once when the buckets are made,
  so a device-to-host copy into it is a DMA; :meth:`HostRegistry.close` unregisters it, and
  :meth:`hpctrain.comm.base.GradSync.close` calls it (through ``Bucket.release``) before the
  strategy frees the window. Without CUDA it does nothing.
* :func:`cuda_aware`: is the MPI library CUDA-aware (may device pointers go to MPI calls)?
  ``HPCTRAIN_CUDA_AWARE_MPI=0|1`` decides when set; otherwise the library is asked:
  ``MPIX_Query_cuda_support()`` (Open MPI >= 2, MVAPICH2 >= 2.3.4, MPICH >= 4.1), else MPICH's
  ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &ok)``, both looked up with ctypes in the
  process (mpi4py loads libmpi globally; mpi4py 4.1 has no wrapper for either). Open MPI's
  answer is the runtime one (built with CUDA *and* enabled: ``ompi_info --parsable --all |
  grep mpi_built_with_cuda_support`` shows the build half); MPICH's is 0 under
  ``MPIR_CVAR_ENABLE_GPU=0``. A library with neither symbol counts as not CUDA-aware.
* :func:`nonblocking_device_ok`: may device pointers also go to *non-blocking* collectives
  (``Iallreduce``)? Not in Open MPI even when it is CUDA-aware: its non-blocking collectives
  (libnbc) reduce on the CPU and crash on device memory (open-mpi/ompi #9845, #12045); only its
  blocking collectives and point-to-point calls take CUDA buffers. ``HPCTRAIN_CUDA_AWARE_NBC=0|1``
  decides when set; otherwise only an MPICH-family library whose ``MPIX_GPU_query_support``
  says CUDA counts (MPICH moves GPU buffers in every collective). Everything else: no, and the
  ring (:mod:`hpctrain.comm.ring`) replaces MPI's non-blocking collective for device buffers.

The CUDA calls here (``torch.cuda.cudart()``) run in the GPU suite only (docs/gpus.md); the CPU
suite runs the rest with a fake ``cudart`` (tests/unit/test_comm_cuda_mpi.py,
tests/mpi/test_comm_staging.py).
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import os
from typing import Any

import torch

AWARE_SWITCH = "HPCTRAIN_CUDA_AWARE_MPI"
NBC_SWITCH = "HPCTRAIN_CUDA_AWARE_NBC"
PAGE_BYTES = mmap.PAGESIZE
MPIX_GPU_SUPPORT_CUDA = 0   # MPICH's mpi.h: enum { MPIX_GPU_SUPPORT_CUDA, _ZE, _HIP }


def cudart() -> Any:
    """torch's CUDA runtime bindings (an untyped module), or None where torch sees no CUDA device."""
    return torch.cuda.cudart() if torch.cuda.is_available() else None


def page_ranges(spans) -> list[tuple[int, int]]:
    """``(address, n_bytes)`` spans widened to whole pages and merged where they touch or
    overlap, sorted: what ``cudaHostRegister`` is given, since two buckets' buffers may share a
    page (the window aligns them to cache lines) and a page cannot be registered twice."""
    pages = sorted((start // PAGE_BYTES * PAGE_BYTES, -(-(start + n) // PAGE_BYTES) * PAGE_BYTES)
                   for start, n in spans if n > 0)
    merged: list[list[int]] = []
    for lo, hi in pages:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi - lo) for lo, hi in merged]


def _check(err, what: str) -> None:
    code = int(getattr(err, "value", err))
    if code != 0:
        raise RuntimeError(f"{what} failed: CUDA error {code} ({err})")


class HostRegistry:
    """Host memory page-locked with the CUDA driver for as long as the buckets use it."""

    __slots__ = ("cudart", "ranges")

    def __init__(self, runtime=None):
        self.cudart = runtime       # None: no CUDA, nothing to register
        self.ranges = []            # (address, n_bytes) registered, in order

    def register(self, tensors) -> None:
        """Register the memory of every host tensor in ``tensors`` not already page-locked."""
        if self.cudart is None:
            return
        spans = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors
                 if t.numel() and t.device.type == "cpu" and not t.is_pinned()]
        for start, n_bytes in page_ranges(spans):
            _check(self.cudart.cudaHostRegister(start, n_bytes, 0), "cudaHostRegister")
            self.ranges.append((start, n_bytes))

    def close(self) -> None:
        """Unregister everything (idempotent); before the memory itself is freed."""
        while self.ranges:
            start, _ = self.ranges.pop()
            _check(self.cudart.cudaHostUnregister(start), "cudaHostUnregister")


def override(environ=os.environ, switch: str = AWARE_SWITCH) -> bool | None:
    """``HPCTRAIN_CUDA_AWARE_MPI`` (or ``switch``): True, False, or None when unset or empty."""
    value = environ.get(switch, "").strip()
    if value == "":
        return None
    if value not in ("0", "1"):
        what = ("stage through host memory", "the MPI library takes device buffers")
        if switch == NBC_SWITCH:
            what = ("no device buffers in non-blocking collectives",
                    "the MPI library's non-blocking collectives take device buffers")
        raise ValueError(f"{switch}={value!r}: use 0 ({what[0]}) or 1 ({what[1]})")
    return value == "1"


def query_library(lib) -> tuple[bool, str]:
    """Ask the MPI library ``lib`` (a ctypes library) whether it takes CUDA buffers."""
    fn = getattr(lib, "MPIX_Query_cuda_support", None)
    if fn is not None:
        fn.restype = ctypes.c_int
        ok = bool(fn())
        return ok, f"MPIX_Query_cuda_support() = {int(ok)}"
    fn = getattr(lib, "MPIX_GPU_query_support", None)
    if fn is not None:
        flag = ctypes.c_int(0)
        fn.restype = ctypes.c_int
        err = fn(ctypes.c_int(MPIX_GPU_SUPPORT_CUDA), ctypes.byref(flag))
        aware = err == 0 and bool(flag.value)
        return aware, f"MPIX_GPU_query_support(CUDA) = {int(aware)}"
    return False, "the MPI library has no CUDA query (taken as not CUDA-aware)"


def query_nonblocking(lib, version: str) -> tuple[bool, str]:
    """Do the non-blocking collectives of ``lib`` (a ctypes library whose
    ``MPI_Get_library_version`` is ``version``) take CUDA buffers? Only an MPICH-family library
    that says so through ``MPIX_GPU_query_support``; never Open MPI (libnbc reduces on the CPU)."""
    if version.lstrip().startswith("Open MPI"):
        return False, "Open MPI's non-blocking collectives reduce on the CPU"
    if getattr(lib, "MPIX_GPU_query_support", None) is None:
        return False, "no MPIX_GPU_query_support (taken as host-only non-blocking collectives)"
    aware, how = query_library(_OnlyGpuQuery(lib))
    return aware, how


class _OnlyGpuQuery:
    """``lib`` seen through MPICH's GPU query alone (MPICH >= 4.1 has both queries)."""

    def __init__(self, lib):
        self.MPIX_GPU_query_support = lib.MPIX_GPU_query_support


@functools.lru_cache(maxsize=1)
def _library_answer() -> tuple[bool, str]:
    # Through mpi4py's own extension module: dlsym on its handle searches the MPI library it
    # links. The global namespace is not enough: Open MPI is loaded RTLD_GLOBAL, MPICH is not.
    from mpi4py import MPI  # initialises MPI: the query must follow MPI_Init
    return query_library(ctypes.CDLL(MPI.__file__))


def cuda_aware(environ=os.environ) -> tuple[bool, str]:
    """``(is the MPI library CUDA-aware, how that was decided)``; the switch wins."""
    forced = override(environ)
    if forced is not None:
        return forced, f"{AWARE_SWITCH}={int(forced)}"
    return _library_answer()


@functools.lru_cache(maxsize=1)
def _library_nonblocking_answer() -> tuple[bool, str]:
    from mpi4py import MPI
    return query_nonblocking(ctypes.CDLL(MPI.__file__), MPI.Get_library_version())


def nonblocking_device_ok(environ=os.environ) -> tuple[bool, str]:
    """``(may device buffers go to MPI's non-blocking collectives, how that was decided)``;
    ``HPCTRAIN_CUDA_AWARE_NBC`` wins. False whenever the library is not CUDA-aware at all."""
    forced = override(environ, NBC_SWITCH)
    if forced is not None:
        return forced, f"{NBC_SWITCH}={int(forced)}"
    if not cuda_aware(environ)[0]:
        return False, "the MPI library is not CUDA-aware"
    return _library_nonblocking_answer()
