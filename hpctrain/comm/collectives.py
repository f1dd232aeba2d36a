"""Small collectives the training loop needs besides gradient sync: parameter broadcast and
metric reduction. NumPy views of torch storage cross MPI; nothing is pickled."""
from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI


def broadcast_tensors(tensors, comm: MPI.Comm, root: int = 0) -> None:
    """Overwrite every rank's tensors with ``root``'s, in place (contiguous tensors; a device
    tensor travels through a host copy)."""
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError("broadcast_tensors needs contiguous tensors")
        if t.device.type == "cpu":
            comm.Bcast(t.detach().numpy(), root=root)
        else:
            host = t.detach().cpu()
            comm.Bcast(host.numpy(), root=root)
            t.copy_(host)


def broadcast_module(module: torch.nn.Module, comm: MPI.Comm, root: int = 0) -> None:
    """Make parameters and buffers (BN statistics) identical to ``root``'s."""
    broadcast_tensors([t for t in module.state_dict().values() if t.numel()], comm, root)


def allreduce_sum(values, comm: MPI.Comm) -> np.ndarray:
    """Sum a small vector of float64 metrics over ranks (e.g. correct, count, loss sum)."""
    buf = np.asarray(values, dtype=np.float64).copy()
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    return buf


def checksum(tensors) -> float:
    """A float64 sum of all elements weighted by position: differs if any rank's tensors differ."""
    total = 0.0
    for i, t in enumerate(tensors):
        flat = t.detach().double().reshape(-1)
        w = torch.arange(1, flat.numel() + 1, dtype=torch.float64)
        total += float((flat * w).sum()) * (i + 1)
    return total
