"""The collectives themselves, posted non-blocking once the coordinator has agreed them, and
what crosses MPI for a tensor: host memory, NumPy views, and how each dtype is summed.

Each ``post_*`` returns an :class:`~hpctrain.horovod.handles.InFlight`: the MPI requests and a
``finish`` that turns the received buffers into the result (scaling, rounding back to fp16,
copying to the device). Only ``agree``d collectives are posted, in submission order on every
rank, so requests never cross.

Data movement (broadcast, allgather, alltoall) goes as bytes, so every dtype travels unchanged.
Reductions need MPI to understand the numbers: the integer and fp32/fp64 types go as they are;
MPI has no fp16 or bf16 sum (Open MPI raises, MPICH aborts; docs/environment.md), so half-precision
tensors are reduced in an fp32 accumulator and rounded once at the end - more accurate than
Horovod's CPU path, which adds in fp16. Device tensors are staged through host memory.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from mpi4py import MPI

from hpctrain.horovod.errors import unsupported
from hpctrain.horovod.handles import InFlight

Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5     # Horovod's ReduceOp values
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}
MPI_OPS = {Average: MPI.SUM, Sum: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX, Product: MPI.PROD}


def op_of(op, average) -> int:
    """Horovod's ``average``/``op`` rule: ``op`` supersedes the deprecated ``average``."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise unsupported("op=Adasum", "use op=hvd.Average (or hvd.Sum); Adasum's pairwise "
                          "combination is not implemented (docs/horovod.md)")
    if op not in OP_NAMES:
        raise ValueError(f"hpctrain.horovod: unknown reduction op {op!r}")
    return op


SUPPORTED = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
             torch.float16, torch.bfloat16, torch.float32, torch.float64)
ACCUMULATE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check(tensor, what: str = "tensor") -> None:
    """Horovod's tensor checks, as one line: a torch tensor of a dtype it reduces."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"hpctrain.horovod: {what} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED or tensor.is_sparse:
        raise ValueError(f"Tensor type {tensor.type()} is not supported "
                         f"(hpctrain.horovod takes {', '.join(dtype_name(d) for d in SUPPORTED)})")


def host(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor with ``tensor``'s values (itself where it already is one)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous()


def raw(t: torch.Tensor) -> np.ndarray:
    """A NumPy byte view of a contiguous CPU tensor (any dtype, 0-d included)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def numeric(t: torch.Tensor) -> np.ndarray:
    """A NumPy view MPI can reduce (not for fp16/bf16: see :func:`accumulator`)."""
    return t.reshape(-1).numpy()


def accumulator(src: torch.Tensor, prescale: float) -> torch.Tensor | None:
    """A fresh buffer holding ``prescale * src`` in a type MPI can sum, or None where ``src``
    itself can go to MPI unchanged (no prescale, a type MPI sums)."""
    acc = ACCUMULATE.get(src.dtype)
    if acc is None and prescale == 1.0:
        return None
    work = src.to(acc) if acc is not None else src.clone()
    return scale_(work, prescale)


def scale_(t: torch.Tensor, factor: float) -> torch.Tensor:
    """``t *= factor`` in place; integers truncate toward zero, as Horovod's scaling does."""
    if factor == 1.0:
        return t
    if t.is_floating_point():
        return t.mul_(factor)
    return t.copy_(torch.trunc(t.double() * factor).to(t.dtype))


def neutral(op: int, dtype: torch.dtype, shape) -> torch.Tensor:
    """What a joined rank contributes: the identity of ``op`` (zeros for sums)."""
    if op in (Average, Sum):
        return torch.zeros(shape, dtype=dtype)
    if op == Product:
        return torch.ones(shape, dtype=dtype)
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    fill = (info.max if op == Min else info.min)
    if dtype.is_floating_point:
        fill = float("inf") if op == Min else float("-inf")
    return torch.full(shape, fill, dtype=dtype)


def split_rows(n_rows: int, n_ranks: int) -> list[int]:
    """Horovod's reducescatter split: as even as possible, the first ranks one row more."""
    base, extra = divmod(n_rows, n_ranks)
    return [base + (1 if r < extra else 0) for r in range(n_ranks)]


def displacements(counts) -> list[int]:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()


def post_allreduce(comm: MPI.Comm, tensor: torch.Tensor, output: torch.Tensor, op: int,
                   prescale: float = 1.0, postscale: float = 1.0) -> InFlight:
    """``output <- postscale * reduce(prescale * tensor)`` (Average also divides by the size)."""
    src = host(tensor)
    work = accumulator(src, prescale)
    if work is None:                        # MPI reads the tensor, writes a fresh buffer
        work = torch.empty_like(src)
        req = comm.Iallreduce(numeric(src), numeric(work), MPI_OPS[op])
    else:
        req = comm.Iallreduce(MPI.IN_PLACE, numeric(work), MPI_OPS[op])
    factor = postscale / comm.Get_size() if op == Average else postscale

    def finish():
        output.detach().copy_(scale_(work, factor).view_as(output))   # detach: leaf params too
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
        flat = torch.cat([host(tensors[i]).reshape(-1) for i in idx])
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
    src = host(tensor if tensor.dim() else tensor.reshape(1))
    row_shape = src.shape[1:]
    row_bytes = int(row_shape.numel()) * src.element_size()
    out = torch.empty((sum(rows), *row_shape), dtype=src.dtype)
    counts = [r * row_bytes for r in rows]
    req = comm.Iallgatherv(raw(src), [raw(out), (counts, displacements(counts)), MPI.BYTE])
    device = tensor.device
    return InFlight([req], lambda: out.to(device) if device.type != "cpu" else out, keep=(src, out))


def post_broadcast(comm: MPI.Comm, tensor: torch.Tensor, output: torch.Tensor, root: int) -> InFlight:
    """``output <- root's tensor`` (bytes: every dtype travels unchanged)."""
    buf = host(tensor)
    if buf.data_ptr() == tensor.data_ptr() and output is not tensor:
        buf = buf.clone()                   # out of place: never write the input
    req = comm.Ibcast(raw(buf), root=root)

    def finish():
        if buf.data_ptr() != output.data_ptr():
            output.detach().copy_(buf.view_as(output))
        return output
    return InFlight([req], finish, keep=(buf,))


def post_alltoall(comm: MPI.Comm, tensor: torch.Tensor, send_rows: list[int]) -> InFlight:
    """Rows ``send_rows[r]`` of ``tensor`` go to rank r; result ``(output, received_rows)``."""
    src = host(tensor)
    recv_rows = comm.alltoall(list(send_rows))          # every rank learns what it receives
    row_elems = int(torch.Size(src.shape[1:]).numel())
    row_bytes = row_elems * src.element_size()
    out = torch.empty((sum(recv_rows), *src.shape[1:]), dtype=src.dtype)
    sc = [r * row_bytes for r in send_rows]
    rc = [r * row_bytes for r in recv_rows]
    req = comm.Ialltoallv([raw(src), (sc, displacements(sc)), MPI.BYTE],
                          [raw(out), (rc, displacements(rc)), MPI.BYTE])
    device = tensor.device

    def finish():
        return (out.to(device) if device.type != "cpu" else out,
                torch.tensor(recv_rows, dtype=torch.int32))
    return InFlight([req], finish, keep=(src, out))


def post_reducescatter(comm: MPI.Comm, tensor: torch.Tensor, op: int,
                       prescale: float = 1.0, postscale: float = 1.0) -> InFlight:
    """Reduce over ranks, rank r keeps its share of dimension 0 (:func:`split_rows`)."""
    src = host(tensor)
    work = accumulator(src, prescale)
    work = src if work is None else work
    n, rank = comm.Get_size(), comm.Get_rank()
    rows = split_rows(src.shape[0], n)
    row_elems = int(torch.Size(src.shape[1:]).numel())
    out = torch.empty((rows[rank], *src.shape[1:]), dtype=work.dtype)
    req = comm.Ireduce_scatter(numeric(work), numeric(out), [r * row_elems for r in rows],
                               MPI_OPS[op])
    factor = postscale / n if op == Average else postscale
    device, dtype = tensor.device, tensor.dtype

    def finish():
        return scale_(out, factor).to(device=device, dtype=dtype)
    return InFlight([req], finish, keep=(work, out))


def post_barrier(comm: MPI.Comm) -> InFlight:
    return InFlight([comm.Ibarrier()], lambda: None)
