"""Small collectives the training loop needs besides gradient sync: parameter broadcast and
metric reduction. NumPy views of torch storage cross MPI; nothing is pickled."""
from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI

BCAST_CHUNK_BYTES = 64 * 2**20
"""Tensors are broadcast packed into one byte buffer per device, up to this many bytes per
``Bcast`` (a larger tensor travels alone), so the copy costs at most this much extra memory."""
_ALIGN = 16     # each tensor starts at a multiple of this in the packed buffer (dtype views)


def _chunks(tensors):
    """Consecutive runs of tensors on one device, each up to ``BCAST_CHUNK_BYTES``."""
    run: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        if run and (t.device != run[0].device or size + n > BCAST_CHUNK_BYTES):
            yield run
            run, size = [], 0
        run.append(t)
        size += -(-n // _ALIGN) * _ALIGN
    if run:
        yield run


def broadcast_tensors(tensors, comm: MPI.Comm, root: int = 0) -> None:
    """Overwrite every rank's tensors with ``root``'s, in place (any strides: a channels-last
    weight is packed and unpacked in its logical order).

    One ``Bcast`` for all of them (per device and ``BCAST_CHUNK_BYTES``), not one per tensor: a
    model's ~160 BatchNorm buffers cost one collective. Device tensors are packed on the device,
    cross to the host in one copy (the one device sync), and back in one asynchronous copy from
    page-locked memory."""
    tensors = [t.detach() for t in tensors]
    for run in _chunks([t for t in tensors if t.numel()]):
        _broadcast_run(run, comm, root)


def _broadcast_run(run, comm: MPI.Comm, root: int) -> None:
    device = run[0].device
    spans, total = [], 0
    for t in run:
        n = t.numel() * t.element_size()
        spans.append((total, n))
        total += -(-n // _ALIGN) * _ALIGN
    on_device = device.type != "cpu"
    host = torch.empty(total, dtype=torch.uint8, pin_memory=on_device and torch.cuda.is_available())
    if comm.Get_rank() == root:
        packed = torch.empty(total, dtype=torch.uint8, device=device) if on_device else host
        for t, (off, n) in zip(run, spans):
            packed[off:off + n].copy_(t.reshape(-1).view(torch.uint8))
        if on_device:
            host.copy_(packed)
    comm.Bcast(host.numpy(), root=root)
    if comm.Get_rank() != root:
        packed = host.to(device, non_blocking=True) if on_device else host
        for t, (off, n) in zip(run, spans):
            t.copy_(packed[off:off + n].view(t.dtype).view_as(t))


def broadcast_module(module: torch.nn.Module, comm: MPI.Comm, root: int = 0) -> None:
    """Make parameters and buffers (BN statistics) identical to ``root``'s."""
    broadcast_tensors([t for t in module.state_dict().values() if t.numel()], comm, root)


def allreduce_sum(values, comm: MPI.Comm) -> np.ndarray:
    """Sum a small vector of float64 metrics over ranks (e.g. correct, count, loss sum)."""
    buf = np.asarray(values, dtype=np.float64).copy()
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return buf


def average_tensors(tensors, comm: MPI.Comm) -> None:
    """Overwrite every rank's tensors with their mean over ranks, in place: one float64
    ``Allreduce`` of all of them, on the host (small buffers: running statistics)."""
    tensors = [t.detach() for t in tensors]
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1).to("cpu", torch.float64) for t in tensors]).numpy()
    comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    flat /= comm.Get_size()
    at = 0
    for t in tensors:
        t.copy_(torch.from_numpy(flat[at:at + t.numel()]).view(t.shape))
        at += t.numel()


def checksum(tensors) -> float:
    """A float64 sum of all elements weighted by position: differs if any rank's tensors differ."""
    total = 0.0
    for i, t in enumerate(tensors):
        flat = t.detach().double().reshape(-1)
        w = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
        total += float((flat * w).sum()) * (i + 1)
    return total
