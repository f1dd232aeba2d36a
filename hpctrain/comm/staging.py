"""Host staging of a bucket whose gradients live on a device: the one seam for device memory.

MPI here reads host memory (mpi4py hands it NumPy views), so a bucket of device parameters keeps
two buffer sets: ``Staging.dev``, the two device-side flat buffers that the ``p.grad`` views live
in (double-buffered exactly like the host ``Bucket.bufs``, see :mod:`hpctrain.comm.buckets`), and
the bucket's host buffers, which the strategies reduce exactly as they reduce a CPU bucket
(pinned memory for ``flat``; for ``hierarchical`` the shared window, page-locked with the CUDA
driver by :class:`hpctrain.comm.cuda_mpi.HostRegistry`). A round is::

    gather into dev[k] -> [pack fp16 on the device] -> device-to-host copy on a side stream,
    event -> the reduction, once the event has completed, host to host -> host-to-device copy
    on the compute stream -> [unpack fp16 on the device] -> dev[1-k], the p.grad views

A compressed bucket (``bucket.packed``: ``flat`` with fp16) packs its gradients on the device with
``kernels.pack_fp16`` (its wire's ``pack``: the CuPy kernel on CUDA tensors, its torch reference
on CPU stand-ins) into a device wire buffer and copies only that (half the bytes) into the host
wire, which the ring reduces; the mean comes back as fp16 and is unpacked on the device
(``kernels.unpack_fp16``). Same kernels, same bytes as the unstaged path, which packs on the
host. ``hierarchical`` sums in fp32 in the window (fp16 only crosses nodes), so its buckets
cross in fp32.

The reduction does not wait for the copy on the host thread: :meth:`Staging.to_host` returns a
:class:`Ready` (the copy's CUDA event) and :func:`after` makes the strategy's generator yield it
before anything else, so :class:`hpctrain.comm.progress.Pending` tests it (``event.query()``,
which never blocks the host or the compute stream) beside MPI requests. In a blocking round
(:attr:`hpctrain.comm.base.GradSync.blocking_round`) the host waits for it at the start instead:
blocking collectives must start in bucket order on every rank. Both paths run the same
arithmetic on the same bytes.

Where a bucket's gradients live is decided in one place, :func:`hpctrain.comm.buckets.make_buckets`,
by :func:`route`: CPU buckets stay as they are ("host"); a device bucket is "staged", or
"direct" (no staging: its buffers go to MPI as they are) when the MPI library is CUDA-aware
(:func:`hpctrain.comm.cuda_mpi.cuda_aware`), the strategy lets MPI sum the bucket's own buffers
(no codec, no window) and this code can hand device buffers to MPI (:data:`DEVICE_HANDOFF`).
``HPCTRAIN_TEST_STAGING=1`` in the environment when the buckets are made routes CPU buckets like
device ones (``dev`` is then just another CPU tensor, copies are plain ``copy_``, every
:class:`Ready` is complete at once), so the CPU test suite runs every line here except the CUDA
calls themselves; those run in the GPU suite (``make test-gpu``, docs/gpus.md).
"""
from __future__ import annotations

import torch

from hpctrain.comm import cuda_mpi, streams
from hpctrain.comm.cuda_mpi import HostRegistry
from hpctrain.comm.progress import Reduction
from hpctrain.ops.testhooks import staging_forced

__all__ = ["DEVICE_HANDOFF", "HostRegistry", "Ready", "Staging", "after", "forced",
           "mpi_takes_device_buffers", "pin_host", "produced", "route"]

DEVICE_HANDOFF = True
"""Can a CUDA bucket's buffers go to MPI as they are? ``ring.py`` passes device tensors to MPI
as themselves (mpi4py reads DLPack / ``__cuda_array_interface__``: ``ring.AS_TENSOR``), keeps
its receive buffer and scratch beside them, and waits for the stream before MPI reads a
partial sum a kernel wrote; a direct bucket's reduction starts once the compute stream's event
(:func:`produced`) has completed. Set False to stage even under a CUDA-aware MPI."""


def forced() -> bool:
    """Do the tests ask CPU buckets to take the device path? (read at bucket creation;
    :mod:`hpctrain.ops.testhooks`)"""
    return staging_forced()


def pin_host() -> bool:
    """Are host staging buffers pinned (page-locked)? Only where CUDA can use it."""
    return torch.cuda.is_available()


def mpi_takes_device_buffers(device: torch.device) -> bool:
    """May a bucket on ``device`` give MPI its buffers as they are? The MPI library must be
    CUDA-aware (``HPCTRAIN_CUDA_AWARE_MPI`` or the library's answer); a CUDA bucket also needs
    :data:`DEVICE_HANDOFF`. CPU stand-ins (the test switch) need only the first."""
    return cuda_mpi.cuda_aware()[0] and (device.type == "cpu" or DEVICE_HANDOFF)


def direct_route(device_type: str, *, forced: bool, direct_ok: bool, one_rank: bool, mpi_takes) -> bool:
    """Are a device bucket's buffers reduced where they are (no staging)? Only where the
    strategy lets MPI sum the bucket's own buffers (``direct_ok``), and then: with one rank
    always for real device memory (nothing crosses to another rank, so a device -> host -> device
    round trip would only cost time; the reduction is a copy and a check on the device), else
    where the MPI library takes device buffers (``mpi_takes()``, asked only then). CPU buckets
    take it only as stand-ins (``forced``), and as stand-ins only by the MPI's answer."""
    if not direct_ok or (device_type == "cpu" and not forced):
        return False
    if one_rank and device_type != "cpu":
        return True
    return bool(mpi_takes())


def route(device_type: str, *, forced: bool, direct: bool) -> str:
    """Where a bucket's gradients live: ``"host"`` (a CPU bucket: its host buffers),
    ``"direct"`` (device buffers handed to MPI as they are: ``direct`` says the strategy and the
    MPI library allow it) or ``"staged"`` (device buffers copied through host buffers)."""
    if device_type == "cpu" and not forced:
        return "host"
    return "direct" if direct else "staged"


class Ready:
    """The device-to-host copy of one round: complete once its CUDA event is (``None``: at once).
    :class:`hpctrain.comm.progress.Pending` tests it beside MPI requests."""

    __slots__ = ("event",)

    def __init__(self, event=None):
        self.event = event

    def test(self) -> bool:
        """Never blocks (``cudaEventQuery``)."""
        return self.event is None or self.event.query()

    def wait(self) -> None:
        """Blocks the host thread only (``cudaEventSynchronize``), never a stream."""
        if self.event is not None:
            self.event.synchronize()


DONE = Ready()


def produced(t: torch.Tensor) -> Ready:
    """A direct bucket's input is complete once the compute stream has run what was queued so
    far (backward wrote it): an event recorded there now. Host memory: at once."""
    api = streams.API
    if not api.handles(t.device):
        return DONE
    event = api.Event()
    event.record(api.current_stream(t.device))
    return Ready(event)


def after(ready: Ready, gen: Reduction, wait: bool = False) -> Reduction:
    """Generator: ``gen`` (a reduction) once ``ready`` has completed; yields ``[ready]`` while it
    has not. ``wait``: block for it at the start instead (a blocking round)."""
    if wait:
        ready.wait()
    elif not ready.test():
        yield [ready]
    return (yield from gen)


class Staging:
    """The device side of one bucket: ``dev`` (two flat buffers on ``device``), a device wire
    buffer for compressed buckets, and the copies between them and the bucket's host buffers."""

    __slots__ = ("device", "dev", "dev_wire", "landed", "cuda", "api", "stream", "ready", "back",
                 "registry")

    def __init__(self, n_elems: int, dtype: torch.dtype, device: torch.device,
                 registry: HostRegistry | None = None):
        self.device = torch.device(device)
        self.dev = [torch.zeros(n_elems, dtype=dtype, device=self.device) for _ in (0, 1)]
        self.dev_wire: torch.Tensor | None = None     # made with a compressed bucket's wire (host_wire)
        self.landed = True          # is this round's mean on the device already?
        self.cuda = self.device.type == "cuda"      # real CUDA memory (pinning, registration)
        # streams and events (hpctrain.comm.streams; a recording fake in tests), None: host copies
        self.api = streams.API if streams.API.handles(self.device) else None
        self.stream = self.api.Stream(self.device) if self.api else None
        self.ready = Ready(self.api.Event()) if self.api else DONE      # device -> host done
        self.back = Ready(self.api.Event()) if self.api else DONE       # host -> device done
        self.registry = registry    # host memory registered with the driver, shared by buckets

    def host_wire(self, wire: torch.Tensor) -> torch.Tensor:
        """The host wire buffer to copy into: ``wire``, or on CUDA a pinned one like it (once;
        the codec allocated it pageable), and the device wire beside it."""
        if self.dev_wire is None:
            self.dev_wire = torch.empty_like(wire, device=self.device)
        if self.cuda and not wire.is_pinned():
            wire = wire.pin_memory()
        return wire

    def to_host(self, dev_flat: torch.Tensor, host_flat: torch.Tensor, wire=None,
                scale: float = 1.0) -> Ready:
        """Queue ``host_flat <- dev_flat``, or with ``wire`` (a bucket's
        :class:`~hpctrain.comm.wire.Wire`, staged by :meth:`host_wire`): pack ``scale * dev_flat``
        into the device wire and queue ``wire.buf <- dev_wire``. Returns what the reduction
        waits on before MPI may read the host buffer."""
        self.landed = False
        if self.api is None:
            self._copy_out(dev_flat, host_flat, wire, scale)
            return self.ready
        assert self.stream is not None      # made with the api
        self.stream.wait_stream(self.api.current_stream(self.device))   # gradients complete
        with self.api.stream(self.stream):
            self._copy_out(dev_flat, host_flat, wire, scale)
            self.ready.event.record(self.stream)
        return self.ready

    def _copy_out(self, dev_flat, host_flat, wire, scale) -> None:
        async_ = self.api is not None
        if wire is None:
            host_flat.copy_(dev_flat, non_blocking=async_)
        else:       # the kernels run on the current (side) stream, in place, no host sync
            wire.pack([dev_flat], scale, into=self.dev_wire)
            wire.buf.copy_(self.dev_wire, non_blocking=async_)

    def to_device(self, host_flat: torch.Tensor, dev_out: torch.Tensor, wire=None) -> torch.Tensor:
        """``dev_out <- host_flat`` (or the encoded mean in ``wire.buf``, unpacked on the device)
        once per round, queued on the compute stream, which the optimiser step reads
        ``p.grad`` on after it; returns ``dev_out``."""
        if not self.landed:
            async_ = self.api is not None
            if wire is None:
                dev_out.copy_(host_flat, non_blocking=async_)
            else:
                assert self.dev_wire is not None    # host_wire staged this wire
                self.dev_wire.copy_(wire.buf, non_blocking=async_)
                wire.unpack([dev_out], source=self.dev_wire)
            if self.api is not None:    # async: the host buffer is read until this completes (drain)
                self.back.event.record(self.api.current_stream(self.device))
            self.landed = True
        return dev_out

    def drain(self) -> None:
        """Block the host until every copy this bucket queued has completed: the device-to-host
        copy on the side stream and the host-to-device copy of the mean on the compute stream
        (events only; no device-wide sync). Before its host memory is unregistered or freed:
        a DMA still running from a freed or unregistered page is undefined behaviour."""
        self.ready.wait()
        self.back.wait()

    def release(self) -> None:
        """Unregister the host memory (before the strategy frees it; after :meth:`drain` of
        every bucket sharing the registry); idempotent."""
        if self.registry is not None:
            self.registry.close()

    def describe(self) -> str:
        how = "pinned " if pin_host() else ""
        if self.registry is not None and self.registry.ranges:
            how = "registered "
        return f"{self.device} via {how}host memory"
