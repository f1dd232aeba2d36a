"""Gradient synchronisation: the interface every strategy implements, and the shared bucket code.

A strategy sums a flat float buffer across ranks (``reduce_bucket``); everything else — grouping
parameters into fusion buckets in reverse order of use, copying gradients in and out, averaging —
lives here once (ChainerMN keeps the MPI plumbing in its base communicator the same way).
Buffers are allocated once at construction: the hot path allocates nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hpctrain.topology import Topology


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one flat buffer."""
    params: list            # torch.nn.Parameter, in bucket order
    offsets: list           # element offset of each parameter in ``flat``
    flat: torch.Tensor      # 1-D buffer, dtype of the parameters
    index: int

    @property
    def n_elems(self) -> int:
        return self.flat.numel()

    def gather_grads(self) -> None:
        """Copy each parameter's gradient into the flat buffer (zeros where a grad is missing)."""
        for p, off in zip(self.params, self.offsets):
            dst = self.flat[off:off + p.numel()]
            if p.grad is None:
                dst.zero_()
            else:
                dst.copy_(p.grad.reshape(-1))

    def scatter_grads(self) -> None:
        """Copy the reduced buffer back into each parameter's gradient."""
        for p, off in zip(self.params, self.offsets):
            src = self.flat[off:off + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = src.clone()
            else:
                p.grad.copy_(src)


def make_buckets(params, bucket_bytes: int) -> list[Bucket]:
    """Group parameters into buckets of about ``bucket_bytes``, last-used (last-defined) first.

    Backward produces gradients roughly in reverse definition order, so reversing lets the first
    bucket be complete earliest (PyTorch DDP and Horovod fuse the same way). Parameters of a
    different dtype start a new bucket.
    """
    buckets, cur, cur_bytes = [], [], 0
    for p in reversed(list(params)):
        n_bytes = p.numel() * p.element_size()
        if cur and (cur_bytes + n_bytes > bucket_bytes or p.dtype != cur[0].dtype):
            buckets.append(cur)
            cur, cur_bytes = [], 0
        cur.append(p)
        cur_bytes += n_bytes
    if cur:
        buckets.append(cur)
    out = []
    for i, group in enumerate(buckets):
        offsets = np.cumsum([0] + [p.numel() for p in group[:-1]]).tolist()
        flat = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype)
        out.append(Bucket(params=group, offsets=offsets, flat=flat, index=i))
    return out


class GradSync:
    """Averages the gradients of ``params`` over ``topology.comm`` (the mean, as SSGD needs).

    Subclasses override :meth:`reduce_bucket` (sum a flat buffer in place across ranks).
    Call :meth:`allreduce_grads` after ``backward()`` and before ``optimizer.step()``.
    """

    name = "base"

    def __init__(self, params, topology: Topology, bucket_bytes: int = 25 * 2**20):
        self.params = [p for p in params if p.requires_grad]
        self.topo = topology
        self.comm = topology.comm
        self.buckets = make_buckets(self.params, bucket_bytes)

    # --- what a strategy provides -------------------------------------------------------------
    def reduce_bucket(self, bucket: Bucket) -> None:
        """Sum ``bucket.flat`` over all ranks, in place."""
        raise NotImplementedError

    # --- shared driver ------------------------------------------------------------------------
    def allreduce_grads(self) -> None:
        """Replace every parameter's gradient by its mean over ranks."""
        inv = 1.0 / self.comm.Get_size()
        for bucket in self.buckets:
            bucket.gather_grads()
            self.reduce_bucket(bucket)
            bucket.flat.mul_(inv)
            bucket.scatter_grads()

    def close(self) -> None:
        """Release communicators/windows a strategy created (the base holds none)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A zero-copy NumPy view of a contiguous CPU tensor (what MPI sends)."""
    return t.detach().numpy()
