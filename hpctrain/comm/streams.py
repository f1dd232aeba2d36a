"""The CUDA stream and event calls of the comm layer, in one replaceable place.

:mod:`hpctrain.comm.staging` (side-stream copies, their events) and :mod:`hpctrain.comm.ring`
(the direct route's kernels on the ring's own stream) make every stream/event call through
:data:`API`, read when a bucket or ring is built. :class:`TorchCuda` is ``torch.cuda`` for CUDA
devices. No GPU is at hand where this is developed, so the ordering of those calls (which
stream waits on what, when the host blocks, what is recorded before memory is released) is
checked on CPU stand-ins by substituting a recording fake (``tests/unit/fake_cuda.py``) that
claims CPU tensors as its device's: the copies and kernels run for real on the CPU, and the
calls are logged. Every host read of a device flag in the comm layer goes through
:func:`host_read` too, so the fake counts the host syncs a round makes.
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

    def host_read(self, flag: torch.Tensor) -> bool:
        """Read a device flag on the host: the host waits for every kernel queued before it."""
        return bool(flag)

    def record_stream(self, t: torch.Tensor, s) -> None:
        """Tell the caching allocator that ``s`` uses ``t`` (made on another stream)."""
        t.record_stream(s)


def host_read(flag) -> bool:
    """The one way the comm layer reads a device-side flag on the host (a host sync on a GPU),
    through :data:`API` so the CPU fake counts it; host values (bool, NumPy) pass through."""
    if isinstance(flag, torch.Tensor):
        return API.host_read(flag)
    return bool(flag)


def any_flag(flags) -> bool:
    """OR of a round's overflow flags: host bools as they are, device flags (0-d bool tensors,
    :func:`hpctrain.comm.fused.scale_and_check` with ``keep``) combined on the device and read
    once (one host read per round instead of one per bucket)."""
    found = any(bool(f) for f in flags if not isinstance(f, torch.Tensor))
    on_device = [f for f in flags if isinstance(f, torch.Tensor)]
    if on_device and not found:
        found = host_read(torch.stack(on_device).any() if len(on_device) > 1 else on_device[0])
    return found


class FlagCopy:
    """A 0-d device flag copied to host memory behind the work queued so far (a non-blocking
    copy into page-locked memory, then an event): :meth:`ready` asks the event without blocking
    (``cudaEventQuery``) and :meth:`read` then costs no host sync; where it is not ready yet,
    :meth:`read` waits for that event only (``cudaEventSynchronize``), never for the work
    queued after it. ``bool(flag)`` instead would wait for the whole stream, the next step's
    forward and backward included. A host flag (or a device :data:`API` does not handle) is
    read as it is."""

    __slots__ = ("host", "event")

    def __init__(self, flag: torch.Tensor):
        api = API
        self.event = None
        self.host = flag
        if api.handles(flag.device):
            self.host = torch.empty((), dtype=flag.dtype, pin_memory=flag.is_cuda)
            self.host.copy_(flag, non_blocking=True)
            self.event = api.Event()
            self.event.record(api.current_stream(flag.device))

    def ready(self) -> bool:
        """Has the copy landed? Never blocks."""
        return self.event is None or self.event.query()

    def read(self) -> bool:
        """The flag's value on the host (waits for the copy's event only, if not :meth:`ready`)."""
        if self.event is not None and not self.event.query():
            self.event.synchronize()
        if self.event is None:
            return host_read(self.host)
        return bool(self.host.numpy())      # page-locked host memory: nothing to wait for


API = TorchCuda()
"""The stream/event calls in use (tests substitute a recording fake)."""
