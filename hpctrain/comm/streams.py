"""The CUDA stream and event calls of the comm layer, in one replaceable place.

:mod:`hpctrain.comm.staging` (side-stream copies, their events) and :mod:`hpctrain.comm.ring`
(the direct route's kernels on the ring's own stream) make every stream/event call through
:data:`API`, read when a bucket or ring is built. :class:`TorchCuda` is ``torch.cuda`` for CUDA
devices. No GPU is at hand where this is developed, so the ordering of those calls (which
stream waits on what, when the host blocks, what is recorded before memory is released) is
checked on CPU stand-ins by substituting a recording fake (``tests/unit/fake_cuda.py``) that
claims CPU tensors as its device's: the copies and kernels run for real on the CPU, and the
calls are logged.
"""
from __future__ import annotations

import torch


class TorchCuda:
    """``torch.cuda``'s streams and events, for CUDA devices only."""

    def handles(self, device) -> bool:
        return torch.device(device).type == "cuda"

    def Stream(self, device) -> torch.cuda.Stream:
        return torch.cuda.Stream(device)

    def Event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def current_stream(self, device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def stream(self, s) -> torch.cuda.StreamContext:
        return torch.cuda.stream(s)


API = TorchCuda()
"""The stream/event calls in use (tests substitute a recording fake)."""
