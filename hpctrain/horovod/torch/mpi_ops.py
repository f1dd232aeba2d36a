"""Horovod's tensor collectives, same names, signatures, defaults and semantics.

Every call is first agreed by the coordinator (:mod:`.coordinator`: a mismatch or a stall ends the
job with one line), then posted non-blocking (:mod:`.collectives`); ``*_async`` calls return an
integer handle for :func:`poll` / :func:`synchronize`, the others wait. The out-of-place forms
are autograd functions with Horovod's gradients (allreduce -> allreduce; allgather -> averaged
gradient, own rows; broadcast -> averaged gradient on the root, zeros elsewhere; alltoall ->
alltoall back; reducescatter -> allgather).
"""
from __future__ import annotations

import itertools
import warnings
from typing import Any

import torch

from hpctrain.horovod.torch import buffers as B
from hpctrain.horovod.torch import collectives as C
from hpctrain.horovod.torch.basics import agree, state
from hpctrain.horovod.torch.compression import Compression
from hpctrain.horovod.torch.coordinator import Sig
from hpctrain.horovod.torch.errors import unsupported
from hpctrain.horovod.torch.process_sets import check_process_set, global_process_set

Average, Sum, Adasum, Min, Max, Product = B.Average, B.Sum, B.Adasum, B.Min, B.Max, B.Product

_handles: dict[int, C.InFlight] = {}
_next_handle = itertools.count(1)


def _handle(op: C.InFlight) -> int:
    h = next(_next_handle)
    _handles[h] = op
    return h


def _op(op, average) -> int:
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
    if op not in B.OP_NAMES:
        raise ValueError(f"hpctrain.horovod: unknown reduction op {op!r}")
    return op


def _sig(kind, tensor, name, op=None, root=-1, free_dim0=False, extra=None) -> Sig:
    shape = tuple(tensor.shape)
    if free_dim0:
        shape = ("*", *shape[1:])
    return Sig(kind, name or state().auto_name(kind), B.dtype_name(tensor.dtype), shape,
               B.OP_NAMES[op] if op is not None else "", root, extra)


def _comm():
    return state().comm


# --- allreduce -----------------------------------------------------------------------------
def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set) -> int:
    check_process_set(process_set)
    B.check(tensor)
    agree(_sig("allreduce", tensor, name, op))
    return _handle(C.post_allreduce(_comm(), tensor, output, op, prescale_factor, postscale_factor))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> int:
    """Start averaging (or ``op``-reducing) ``tensor`` over all ranks; the input is not modified."""
    op = _op(op, average)
    return _allreduce_async(tensor, torch.empty_like(tensor), name, op, prescale_factor,
                            postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> int:
    """In-place :func:`allreduce_async`."""
    op = _op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """In-place :func:`allreduce`."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.args = op, prescale, postscale, process_set
        return synchronize(_allreduce_async(tensor, torch.empty_like(tensor), name, op, prescale,
                                            postscale, process_set))

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        return (allreduce(grad, op=op, prescale_factor=prescale, postscale_factor=postscale,
                          process_set=process_set), None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """The average (or ``op``) of ``tensor`` over all ranks, as a new tensor; differentiable."""
    op = _op(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


# --- grouped allreduce -------------------------------------------------------------------------
def _grouped_async(tensors, outputs, name, op, prescale, postscale, process_set) -> int:
    check_process_set(process_set)
    tensors = list(tensors)
    for t in tensors:
        B.check(t)
    sig = Sig("grouped_allreduce", name or state().auto_name("grouped_allreduce"),
              ",".join(B.dtype_name(t.dtype) for t in tensors), tuple(tuple(t.shape) for t in tensors),
              B.OP_NAMES[op])
    agree(sig)
    return _handle(C.post_grouped_allreduce(_comm(), tensors, outputs, op, prescale, postscale))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> int:
    op = _op(op, average)
    tensors = list(tensors)
    return _grouped_async(tensors, [torch.empty_like(t) for t in tensors], name, op,
                          prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> int:
    op = _op(op, average)
    tensors = list(tensors)
    return _grouped_async(tensors, tensors, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set) -> list[torch.Tensor]:
    """:func:`allreduce` of a list of tensors, fused into one reduction per dtype."""
    op = _op(op, average)
    pairs = [compression.compress(t) for t in tensors]
    outs = synchronize(_grouped_async([t for t, _ in pairs], [torch.empty_like(t) for t, _ in pairs],
                                      name, op, prescale_factor, postscale_factor, process_set))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set) -> list[torch.Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# --- allgather ---------------------------------------------------------------------------------
def _allgather(tensor, name, process_set) -> tuple[int, list[int]]:
    check_process_set(process_set)
    B.check(tensor)
    rows = tensor.shape[0] if tensor.dim() else 1
    verdict = agree(_sig("allgather", tensor, name, free_dim0=True, extra=rows))
    counts = [e or 0 for e in verdict.extras]
    return _handle(C.post_allgather(_comm(), tensor, counts)), counts


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (sizes may differ)."""
    return _allgather(tensor, name, process_set)[0]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        handle, counts = _allgather(tensor, name, process_set)
        ctx.rows, ctx.process_set = counts, process_set
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        r = state().topo.rank
        return reduced.narrow(0, sum(ctx.rows[:r]), ctx.rows[r]), None, None


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0; differentiable."""
    return _Allgather.apply(tensor, name, process_set)


# --- broadcast ---------------------------------------------------------------------------------
def _broadcast_async(tensor, output, root_rank, name, process_set) -> int:
    check_process_set(process_set)
    B.check(tensor)
    n = state().topo.size
    if not 0 <= int(root_rank) < n:
        raise ValueError(f"hpctrain.horovod: root_rank {root_rank} is not a rank of this job (size {n})")
    agree(_sig("broadcast", tensor, name, root=int(root_rank)))
    return _handle(C.post_broadcast(_comm(), tensor, output, int(root_rank)))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    return _broadcast_async(tensor, torch.empty_like(tensor), root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s, in place."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=Average, process_set=ctx.process_set)
        if state().topo.rank != ctx.root:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """``root_rank``'s ``tensor`` on every rank, as a new tensor; differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


# --- alltoall ------------------------------------------------------------------------------------
def _alltoall_async(tensor, splits, name, process_set) -> int:
    check_process_set(process_set)
    B.check(tensor)
    n = state().topo.size
    rows = tensor.shape[0] if tensor.dim() else 1
    if splits is None:
        if rows % n:
            raise ValueError(f"hpctrain.horovod: alltoall without splits needs dimension 0 ({rows}) "
                             f"divisible by the number of ranks ({n})")
        send = [rows // n] * n
    else:
        send = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(send) != n or min(send) < 0 or sum(send) != rows:
            raise ValueError(f"hpctrain.horovod: alltoall splits {send} must be {n} non-negative "
                             f"counts summing to dimension 0 ({rows})")
    agree(_sig("alltoall", tensor, name, free_dim0=True))
    return _handle(C.post_alltoall(_comm(), tensor, send))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Start sending rows of ``tensor`` to every rank; :func:`synchronize` returns
    ``(output, received_splits)``."""
    return _alltoall_async(tensor, splits, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(_alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, *unused):
        back, _ = alltoall(grad.contiguous(), splits=ctx.received, process_set=ctx.process_set)
        return back, None, None, None


def alltoall(tensor, splits=None, name=None,
             process_set=global_process_set) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``tensor`` scattered to every rank (equal shares, or ``splits``), rows from every
    rank gathered; with ``splits`` also the rows received from each rank. Differentiable."""
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# --- reducescatter ---------------------------------------------------------------------------
def _reducescatter_async(tensor, name, op, prescale, postscale, process_set) -> int:
    check_process_set(process_set)
    B.check(tensor)
    if op not in (Average, Sum):
        raise ValueError("hpctrain.horovod: reducescatter supports op=Average and op=Sum")
    if tensor.dim() == 0:
        raise ValueError("hpctrain.horovod: reducescatter needs a tensor of at least one dimension")
    agree(_sig("reducescatter", tensor, name, op))
    return _handle(C.post_reducescatter(_comm(), tensor, op, prescale, postscale))


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> int:
    return _reducescatter_async(tensor, name, _op(op, None), prescale_factor, postscale_factor,
                                process_set)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.factor = prescale * postscale / (state().topo.size if op == Average else 1)
        ctx.process_set = process_set
        return synchronize(_reducescatter_async(tensor, name, op, prescale, postscale, process_set))

    @staticmethod
    def backward(ctx, grad):
        return allgather(grad.contiguous(), process_set=ctx.process_set) * ctx.factor, \
            None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce ``tensor`` over ranks and keep this rank's rows (the first ``rows % size`` ranks
    one row more); differentiable."""
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, _op(op, None), prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(out, ctx)


# --- handles, barrier, join ------------------------------------------------------------------
def poll(handle: int) -> bool:
    """True once the collective behind ``handle`` is done (then :func:`synchronize` won't block)."""
    if handle not in _handles:
        raise ValueError(f"hpctrain.horovod: unknown handle {handle!r}")
    return _handles[handle].poll()


def synchronize(handle: int) -> Any:
    """Wait for the collective behind ``handle`` and return its result (None for an unknown handle,
    as Horovod)."""
    op = _handles.pop(handle, None)
    return None if op is None else op.wait()


def barrier(process_set=global_process_set) -> None:
    check_process_set(process_set)
    agree(Sig("barrier", "barrier"))
    C.post_barrier(_comm()).wait()


def join(device=-1) -> int:
    """This rank has no more data: until every rank has joined, take part in the others'
    collectives with a neutral contribution (zeros to sums, no rows to allgather, zero gradients
    to DistributedOptimizer steps). Returns the rank that joined last."""
    while True:
        verdict = agree(Sig("join", "join"))
        if verdict.last_joined >= 0:
            return verdict.last_joined
        _mirror(verdict)


def _mirror(verdict) -> None:
    """A joined rank's part in the collective ``verdict.sig`` the active ranks run."""
    sig, comm = verdict.sig, _comm()
    _follow_auto_name(sig)
    op = {v: k for k, v in B.OP_NAMES.items()}.get(sig.op, Sum)
    dtype = getattr(torch, sig.dtype.split(",")[0]) if sig.dtype else None
    if sig.kind == "allreduce":
        assert dtype is not None            # an allreduce's signature names its tensor's dtype
        t = B.neutral(op, dtype, sig.shape)
        C.post_allreduce(comm, t, t, op).wait()
    elif sig.kind == "grouped_allreduce":
        ts = [B.neutral(op, getattr(torch, d), s) for d, s in zip(sig.dtype.split(","), sig.shape)]
        C.post_grouped_allreduce(comm, ts, ts, op).wait()
    elif sig.kind == "allgather":
        C.post_allgather(comm, torch.empty((0, *sig.shape[1:]), dtype=dtype),
                         [e or 0 for e in verdict.extras]).wait()
    elif sig.kind == "broadcast":
        t = torch.empty(sig.shape, dtype=dtype)
        C.post_broadcast(comm, t, t, sig.root).wait()
    elif sig.kind == "barrier":
        C.post_barrier(comm).wait()
    elif sig.kind == "grad":
        state().optimizers[sig.name].mirror_round()


def _follow_auto_name(sig) -> None:
    """A joined rank does not make the unnamed calls the others make: advance its counter past
    theirs, so automatic names (``allgather.noname.N``) still agree once every rank has joined."""
    prefix = f"{sig.kind}.noname."
    if sig.name.startswith(prefix) and sig.name[len(prefix):].isdigit():
        counters = state().counters
        counters[sig.kind] = max(counters.get(sig.kind, 0), int(sig.name[len(prefix):]) + 1)


def refuse_joined(sig: Sig, joined: tuple) -> str | None:
    """Why ``sig`` cannot run while ``joined`` ranks have joined (None: it can)."""
    if sig.kind in ("allreduce", "grouped_allreduce", "allgather", "barrier", "grad"):
        return None
    if sig.kind == "broadcast":
        return f"its root rank {sig.root} has joined" if sig.root in joined else None
    return "joined ranks take part only in allreduce, allgather, broadcast, barrier and optimizer steps"
