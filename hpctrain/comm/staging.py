"""Host staging of a bucket whose gradients live on a device MPI cannot read.

MPI here reads host memory only (mpi4py hands it NumPy views), so a bucket of device
parameters keeps two buffer sets: ``Staging.dev``, the two device-side flat buffers that the
``p.grad`` views live in (double-buffered exactly like the host ``Bucket.bufs``, see
:mod:`hpctrain.comm.base`), and the bucket's host buffers, which the strategies reduce exactly
as they reduce a CPU bucket (pinned memory for ``flat``; for ``hierarchical`` the shared
window). A round is::

    gather into dev[k]  ->  to_host(dev[k], bufs[k])  ->  [pack fp16 on the host]
    ->  the strategy's reduction, host to host  ->  to_device(bufs[1-k], dev[1-k])  ->  p.grad views

Whether a bucket is staged is decided in one place, :func:`hpctrain.comm.base.make_buckets`:
a bucket of CPU parameters is not (today's path, untouched), any other is. ``HPCTRAIN_TEST_STAGING=1``
in the environment when the buckets are made stages CPU buckets too (``dev`` is then just
another CPU tensor), so the CPU test suite runs every line here except the CUDA calls.

CUDA: the device-to-host copy runs on a side stream that first waits for the compute stream
(the gradients are complete), into pinned memory, and the host thread waits on its event before
MPI reads the buffer. The host-to-device copy of the mean is queued on the compute stream
(``non_blocking``), so the optimiser step that reads ``p.grad`` is ordered after it.

Next steps (issue 15), not done here: pack fp16 on the device with the CuPy kernel before the
copy (half the PCIe bytes; today a staged fp16 bucket crosses PCIe in fp32 and is packed on the
host), register the shared window with the CUDA driver (``cudaHostRegister``) so the copy into
it is a DMA, hand a bucket to MPI when its event has completed instead of waiting for it, and
pass device buffers straight to a CUDA-aware MPI.
"""
from __future__ import annotations

import os

import torch

TEST_SWITCH = "HPCTRAIN_TEST_STAGING"


def forced() -> bool:
    """Does the test switch ask CPU buckets to take the staging path? (read at bucket creation)"""
    return os.environ.get(TEST_SWITCH, "") == "1"


def pin_host() -> bool:
    """Are host staging buffers pinned (page-locked)? Only where CUDA can use it."""
    return torch.cuda.is_available()


class Staging:
    """The device side of one bucket: ``dev`` (two flat buffers on ``device``) and the copies
    between them and the bucket's host buffers."""

    __slots__ = ("device", "dev", "landed", "cuda", "stream", "event")

    def __init__(self, n_elems: int, dtype: torch.dtype, device: torch.device):
        self.device = torch.device(device)
        self.dev = [torch.zeros(n_elems, dtype=dtype, device=self.device) for _ in (0, 1)]
        self.landed = True          # is this round's mean on the device already?
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.event = torch.cuda.Event() if self.cuda else None

    def to_host(self, dev_flat: torch.Tensor, host_flat: torch.Tensor) -> None:
        """``host_flat <- dev_flat``; complete when this returns (MPI may read ``host_flat``)."""
        self.landed = False
        if not self.cuda:
            host_flat.copy_(dev_flat)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            host_flat.copy_(dev_flat, non_blocking=True)
            self.event.record(self.stream)
        self.event.synchronize()    # the host thread waits; the compute stream does not

    def to_device(self, host_flat: torch.Tensor, dev_out: torch.Tensor) -> torch.Tensor:
        """``dev_out <- host_flat`` once per round (queued on the compute stream); returns ``dev_out``."""
        if not self.landed:
            dev_out.copy_(host_flat, non_blocking=self.cuda)
            self.landed = True
        return dev_out

    def describe(self) -> str:
        return f"{self.device} via {'pinned ' if pin_host() else ''}host memory"
