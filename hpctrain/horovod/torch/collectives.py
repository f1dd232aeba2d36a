"""The collectives themselves, posted non-blocking once the coordinator has agreed them.

Each ``post_*`` returns an :class:`InFlight`: the MPI requests and a ``finish`` that turns the
received buffers into the result (scaling, rounding back to fp16, copying to the device). Only
``agree``d collectives are posted, in submission order on every rank, so requests never cross.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from mpi4py import MPI

from hpctrain.horovod.torch import buffers as B
from hpctrain.horovod.torch.errors import HorovodInternalError


class InFlight:
    """A collective in flight: ``poll()`` without blocking, ``wait()`` for the result.

    ``keep`` holds the buffers MPI reads until the requests complete: mpi4py does not keep a
    non-blocking collective's buffers alive, so an async call on a temporary tensor would
    otherwise send freed (reused) memory."""

    __slots__ = ("reqs", "finish", "result", "done", "keep", "t0")

    def __init__(self, reqs: list, finish: Callable[[], object], keep: tuple = ()):
        self.reqs, self.done, self.keep = reqs, False, keep
        self.t0 = 0.0                       # when posted, where a timeline records (handles.py)
        self.finish: Callable[[], object] | None = finish      # None once run (by wait)
        self.result: object = None

    def poll(self) -> bool:
        if not self.done:
            self.done = MPI.Request.Testall(self.reqs)
        return self.done

    def wait(self) -> object:
        if self.finish is not None:
            MPI.Request.Waitall(self.reqs)
            self.done = True
            self.result, self.finish, self.keep = self.finish(), None, ()
        return self.result


class Parked(InFlight):
    """A named async call this rank submitted while the others called ``barrier``: Horovod leaves
    it pending and it never completes (nothing was posted). ``poll()`` stays False; ``wait()``
    (``synchronize``) raises on this rank alone, where Horovod would wait for ever: no other
    rank waits on it, so the error is this rank's to catch."""

    __slots__ = ("line",)

    def __init__(self, kind: str, name: str, rank: int):
        super().__init__([], lambda: None)
        self.line = (f"hpctrain.horovod: {kind} {name!r} was left pending on rank {rank}: the other ranks "
                     "called barrier instead, so it never completes (as in Horovod); submit it on every rank")

    def poll(self) -> bool:
        return False

    def wait(self) -> object:
        raise HorovodInternalError(self.line)


def post_allreduce(comm: MPI.Comm, tensor: torch.Tensor, output: torch.Tensor, op: int,
                   prescale: float = 1.0, postscale: float = 1.0) -> InFlight:
    """``output <- postscale * reduce(prescale * tensor)`` (Average also divides by the size)."""
    src = B.host(tensor)
    work = B.accumulator(src, prescale)
    if work is None:                        # MPI reads the tensor, writes a fresh buffer
        work = torch.empty_like(src)
        req = comm.Iallreduce(B.numeric(src), B.numeric(work), B.MPI_OPS[op])
    else:
        req = comm.Iallreduce(MPI.IN_PLACE, B.numeric(work), B.MPI_OPS[op])
    factor = postscale / comm.Get_size() if op == B.Average else postscale

    def finish():
        output.detach().copy_(B.scale_(work, factor).view_as(output))   # detach: leaf params too
        return output
    return InFlight([req], finish, keep=(src, work))


def post_grouped_allreduce(comm, tensors, outputs, op, prescale=1.0, postscale=1.0) -> InFlight:
    """One fused reduction per dtype of the group (Horovod's tensor fusion)."""
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    reqs: list = []
    finishes: list = []
    keep: list = []
    for idx in by_dtype.values():
        flat = torch.cat([B.host(tensors[i]).reshape(-1) for i in idx])
        fused = post_allreduce(comm, flat, flat, op, prescale, postscale)
        reqs += fused.reqs
        keep += fused.keep

        def finish(fused=fused, flat=flat, idx=idx):
            fused.finish()
            offset = 0
            for i in idx:
                n = outputs[i].numel()
                outputs[i].detach().copy_(flat[offset:offset + n].view_as(outputs[i]))
                offset += n
        finishes.append(finish)

    def finish_all():
        for f in finishes:
            f()
        return list(outputs)
    return InFlight(reqs, finish_all, keep=tuple(keep))


def post_allgather(comm: MPI.Comm, tensor: torch.Tensor, rows: list[int]) -> InFlight:
    """Concatenate every rank's tensor along dimension 0 (``rows[r]`` rows from rank r)."""
    src = B.host(tensor if tensor.dim() else tensor.reshape(1))
    row_shape = src.shape[1:]
    row_bytes = int(row_shape.numel()) * src.element_size()
    out = torch.empty((sum(rows), *row_shape), dtype=src.dtype)
    counts = [r * row_bytes for r in rows]
    req = comm.Iallgatherv(B.raw(src), [B.raw(out), (counts, B.displacements(counts)), MPI.BYTE])
    device = tensor.device
    return InFlight([req], lambda: out.to(device) if device.type != "cpu" else out, keep=(src, out))


def post_broadcast(comm: MPI.Comm, tensor: torch.Tensor, output: torch.Tensor, root: int) -> InFlight:
    """``output <- root's tensor`` (bytes: every dtype travels unchanged)."""
    buf = B.host(tensor)
    if buf.data_ptr() == tensor.data_ptr() and output is not tensor:
        buf = buf.clone()                   # out of place: never write the input
    req = comm.Ibcast(B.raw(buf), root=root)

    def finish():
        if buf.data_ptr() != output.data_ptr():
            output.detach().copy_(buf.view_as(output))
        return output
    return InFlight([req], finish, keep=(buf,))


def post_alltoall(comm: MPI.Comm, tensor: torch.Tensor, send_rows: list[int]) -> InFlight:
    """Rows ``send_rows[r]`` of ``tensor`` go to rank r; result ``(output, received_rows)``."""
    src = B.host(tensor)
    recv_rows = comm.alltoall(list(send_rows))          # every rank learns what it receives
    row_elems = int(torch.Size(src.shape[1:]).numel())
    row_bytes = row_elems * src.element_size()
    out = torch.empty((sum(recv_rows), *src.shape[1:]), dtype=src.dtype)
    sc = [r * row_bytes for r in send_rows]
    rc = [r * row_bytes for r in recv_rows]
    req = comm.Ialltoallv([B.raw(src), (sc, B.displacements(sc)), MPI.BYTE],
                          [B.raw(out), (rc, B.displacements(rc)), MPI.BYTE])
    device = tensor.device

    def finish():
        return (out.to(device) if device.type != "cpu" else out,
                torch.tensor(recv_rows, dtype=torch.int32))
    return InFlight([req], finish, keep=(src, out))


def post_reducescatter(comm: MPI.Comm, tensor: torch.Tensor, op: int,
                       prescale: float = 1.0, postscale: float = 1.0) -> InFlight:
    """Reduce over ranks, rank r keeps its share of dimension 0 (:func:`buffers.split_rows`)."""
    src = B.host(tensor)
    work = B.accumulator(src, prescale)
    work = src if work is None else work
    n, rank = comm.Get_size(), comm.Get_rank()
    rows = B.split_rows(src.shape[0], n)
    row_elems = int(torch.Size(src.shape[1:]).numel())
    out = torch.empty((rows[rank], *src.shape[1:]), dtype=work.dtype)
    req = comm.Ireduce_scatter(B.numeric(work), B.numeric(out), [r * row_elems for r in rows],
                               B.MPI_OPS[op])
    factor = postscale / n if op == B.Average else postscale
    device, dtype = tensor.device, tensor.dtype

    def finish():
        return B.scale_(out, factor).to(device=device, dtype=dtype)
    return InFlight([req], finish, keep=(work, out))


def post_barrier(comm: MPI.Comm) -> InFlight:
    return InFlight([comm.Ibarrier()], lambda: None)
