"""An MPI-3 shared-memory window cut into per-rank segments that torch can use directly.

``Win.Allocate_shared`` over a node-local communicator maps every local rank's allocation into
every local process; ``Shared_query`` gives each one's address. Tensors made here are zero-copy
views of that memory, so a rank's bucket *is* window memory and a neighbour can sum it without
any message (about a tenth of an ``Allreduce``'s time when the gradients already live in the
window: docs/environment.md).

Synchronisation: the window is locked once (``Lock_all``, a passive-target epoch for the whole
lifetime) and every hand-over between ranks is ``Sync`` (a memory barrier: my stores are
visible, later loads see others' stores) around a barrier on the node communicator - the
``MPI_Win_sync`` + barrier idiom of the MPI-3 standard's shared-memory examples.
"""
from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI

ALIGN_BYTES = 64  # a cache line: buckets never share one, so ranks never write the same line


def aligned(n_bytes: int, align: int = ALIGN_BYTES) -> int:
    return -(-n_bytes // align) * align


def layout(sizes) -> tuple[list[int], int]:
    """Byte offset of each ``(n_elems, dtype)`` block and the total, each block cache-line aligned."""
    offsets, total = [], 0
    for n_elems, dtype in sizes:
        offsets.append(total)
        total += aligned(n_elems * torch.empty((), dtype=dtype).element_size())
    return offsets, total


class SharedWindow:
    """Each local rank owns ``seg_bytes``; local rank 0 also owns ``root_bytes`` after them."""

    def __init__(self, intra: MPI.Comm, seg_bytes: int, root_bytes: int = 0):
        self.intra = intra
        mine = seg_bytes + (root_bytes if intra.Get_rank() == 0 else 0)
        self.win = MPI.Win.Allocate_shared(mine, 1, comm=intra)  # type: ignore[arg-type]  # an Intracomm (stub: Split returns Comm)
        self.seg_bytes = seg_bytes
        self.mem = []
        for r in range(intra.Get_size()):
            buf, _ = self.win.Shared_query(r)
            self.mem.append(np.frombuffer(buf, dtype=np.uint8) if len(buf) else np.empty(0, np.uint8))  # type: ignore[call-overload]  # numpy stub: buffers only on 3.12+
        self.win.Lock_all(MPI.MODE_NOCHECK)

    def view(self, rank: int, byte_offset: int, n_elems: int, dtype) -> torch.Tensor:
        """A 1-D tensor over local rank ``rank``'s memory (``byte_offset`` from its start)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        if n_elems == 0:
            return torch.empty(0, dtype=dtype)
        raw = self.mem[rank][byte_offset:byte_offset + n_elems * itemsize]
        return torch.from_numpy(raw).view(dtype)

    def root_view(self, byte_offset: int, n_elems: int, dtype) -> torch.Tensor:
        """A tensor in local rank 0's extra area (after its segment)."""
        return self.view(0, self.seg_bytes + byte_offset, n_elems, dtype)

    def sync(self) -> None:
        """Memory barrier for the window (``MPI_Win_sync``); pair with a barrier on ``intra``."""
        self.win.Sync()

    def free(self) -> None:
        """Unmap the memory (collective); every tensor viewing it must be dropped first."""
        if self.win != MPI.WIN_NULL:
            self.mem = []
            self.win.Unlock_all()
            self.win.Free()
