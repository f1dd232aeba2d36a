"""Horovod's grouped collectives: one agreement and one handle for a list of tensors.

``grouped_allreduce`` fuses the list into one reduction per dtype (Horovod's tensor fusion);
``grouped_allgather`` and ``grouped_reducescatter`` post one collective per tensor behind the
one agreement. Each has Horovod's gradient, tensor by tensor, as its single-tensor form
(:mod:`.mpi_ops`).
"""
from __future__ import annotations

import torch

from hpctrain.horovod.handles import synchronize
from hpctrain.horovod.process_sets import global_process_set, resolve
from hpctrain.horovod.torch import collectives as C
from hpctrain.horovod.torch.collectives import op_of
from hpctrain.horovod.torch.mpi_ops import Average, agree_on, post, reducescatter_grad_factor, reducescatter_problem
from hpctrain.horovod.torch.optimizer import Compression


def _group_fields(tensors, free_dim0=False) -> dict:
    shapes = tuple(("*", *t.shape[1:]) if free_dim0 else tuple(t.shape) for t in tensors)
    return {"dtype": ",".join(C.dtype_name(t.dtype) for t in tensors), "shape": shapes}


def _joined(parts: list[C.InFlight]) -> C.InFlight:
    """One InFlight for several: every request, results in order."""
    reqs = [r for p in parts for r in p.reqs]
    keep = tuple(k for p in parts for k in p.keep)
    return C.InFlight(reqs, lambda: [p.wait() for p in parts], keep=keep)


# --- grouped allreduce -------------------------------------------------------------------------
def _grouped_allreduce_async(tensors, outputs, name, op, prescale, postscale, process_set) -> int:
    ps = resolve(process_set)
    tensors = list(tensors)
    for t in tensors:
        C.check(t)
    _, agreed = agree_on(ps, "grouped_allreduce", name, op=op, **_group_fields(tensors))
    return post(ps, "grouped_allreduce", agreed, name, lambda: C.post_grouped_allreduce(
        ps.comm, tensors, outputs, op, prescale, postscale))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    op = op_of(op, average)
    tensors = list(tensors)
    return _grouped_allreduce_async(tensors, [torch.empty_like(t) for t in tensors], name, op,
                                    prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    op = op_of(op, average)
    tensors = list(tensors)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor,
                                    process_set)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.args = op, prescale, postscale, process_set
        return tuple(synchronize(_grouped_allreduce_async(
            tensors, [torch.empty_like(t) for t in tensors], name, op, prescale, postscale, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        back = grouped_allreduce([g.contiguous() for g in grads], op=op, prescale_factor=prescale,
                                 postscale_factor=postscale, process_set=process_set)
        return (None, None, None, None, None, *back)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set) -> list[torch.Tensor]:
    """:func:`allreduce` of a list of tensors, fused into one reduction per dtype; differentiable."""
    op = op_of(op, average)
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                   *[t for t, _ in pairs])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set) -> list[torch.Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# --- grouped allgather -------------------------------------------------------------------------
def _grouped_allgather(tensors, name, process_set) -> tuple[int, list[list[int]]]:
    ps = resolve(process_set)
    tensors = list(tensors)
    for t in tensors:
        C.check(t)
    rows = tuple(t.shape[0] if t.dim() else 1 for t in tensors)
    verdict, agreed = agree_on(ps, "grouped_allgather", name, extra=rows,
                               **_group_fields(tensors, free_dim0=True))
    counts = [[e[i] for e in verdict.extras] for i in range(len(tensors))]
    return post(ps, "grouped_allgather", agreed, name, lambda: _joined(
        [C.post_allgather(ps.comm, t, c) for t, c in zip(tensors, counts)])), counts


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> int:
    """Start :func:`allgather` of each tensor of the list; :func:`synchronize` returns the list."""
    return _grouped_allgather(tensors, name, process_set)[0]


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        handle, counts = _grouped_allgather(tensors, name, process_set)
        ctx.rows, ctx.process_set = counts, process_set
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=Average,
                                    process_set=ctx.process_set)
        r = resolve(ctx.process_set).rank()
        own = [g.narrow(0, sum(rows[:r]), rows[r]) for g, rows in zip(reduced, ctx.rows)]
        return (None, None, *own)


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> list[torch.Tensor]:
    """:func:`allgather` of each tensor of the list, agreed once; differentiable."""
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# --- grouped reducescatter ---------------------------------------------------------------------
def _grouped_reducescatter_async(tensors, name, op, prescale, postscale, process_set) -> int:
    ps = resolve(process_set)
    tensors = list(tensors)
    for t in tensors:
        C.check(t)
    problem = next((p for p in (reducescatter_problem(t, op) for t in tensors) if p), "")
    _, agreed = agree_on(ps, "grouped_reducescatter", name, op=op, problem=problem, **_group_fields(tensors))
    return post(ps, "grouped_reducescatter", agreed, name, lambda: _joined(
        [C.post_reducescatter(ps.comm, t, op, prescale, postscale) for t in tensors]))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> int:
    return _grouped_reducescatter_async(tensors, name, op_of(op, None), prescale_factor,
                                        postscale_factor, process_set)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.factor = reducescatter_grad_factor(op, prescale, postscale, process_set)
        ctx.process_set = process_set
        return tuple(synchronize(_grouped_reducescatter_async(tensors, name, op, prescale, postscale,
                                                              process_set)))

    @staticmethod
    def backward(ctx, *grads):
        gathered = grouped_allgather([g.contiguous() for g in grads], process_set=ctx.process_set)
        return (None, None, None, None, None, *[g * ctx.factor for g in gathered])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0) -> list[torch.Tensor]:
    """:func:`reducescatter` of each tensor of the list, agreed once; differentiable."""
    pairs = [compression.compress(t) for t in tensors]
    outs = _GroupedReducescatter.apply(name, op_of(op, None), prescale_factor, postscale_factor,
                                       process_set, *[t for t, _ in pairs])
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]
