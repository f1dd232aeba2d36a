"""What crosses MPI for a tensor: host memory, NumPy views, and how each dtype is summed.

Data movement (broadcast, allgather, alltoall) goes as bytes, so every dtype travels unchanged.
Reductions need MPI to understand the numbers: the integer and fp32/fp64 types go as they are;
MPI has no fp16 or bf16 sum (Open MPI raises, MPICH aborts; docs/environment.md), so half-precision
tensors are reduced in an fp32 accumulator and rounded once at the end - more accurate than
Horovod's CPU path, which adds in fp16. Device tensors are staged through host memory.
"""
from __future__ import annotations


import numpy as np
import torch
from mpi4py import MPI


Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5     # Horovod's ReduceOp values
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}
MPI_OPS = {Average: MPI.SUM, Sum: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX, Product: MPI.PROD}

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


