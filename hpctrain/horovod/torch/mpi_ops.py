"""Horovod's tensor collectives, same names, signatures, defaults and semantics.

Every call is first agreed by its process set's coordinator (:mod:`hpctrain.horovod.coordinator`:
a mismatch raises on every rank, a stall ends the job with one line), then posted non-blocking
(:mod:`.collectives`); ``*_async`` calls return an integer handle for :func:`poll` /
:func:`synchronize` (:mod:`hpctrain.horovod.handles`), the others wait. The out-of-place forms
are autograd functions with Horovod's gradients: allreduce -> allreduce with the same op and
scales; allgather -> the averaged gradient's own rows; broadcast -> the averaged gradient on the
root, zeros elsewhere; alltoall -> alltoall back; reducescatter -> allgather, times the set's size
for ``Sum`` (Horovod's convention: each rank's loss gets the reduced gradient, as for allreduce).
Grouped forms are in :mod:`.grouped_ops`, barrier and join in :mod:`.basics`.
"""
from __future__ import annotations

import torch

from hpctrain.horovod.coordinator import Sig, Verdict
from hpctrain.horovod.handles import Parked, check_name, now_if_recording, poll, register, synchronize
from hpctrain.horovod.process_sets import ProcessSet, global_process_set, resolve
from hpctrain.horovod.torch import collectives as C
from hpctrain.horovod.torch.collectives import op_of
from hpctrain.horovod.torch.optimizer import Compression

Average, Sum, Adasum, Min, Max, Product = C.Average, C.Sum, C.Adasum, C.Min, C.Max, C.Product
__all__ = ["poll", "synchronize"]             # Horovod's mpi_ops holds them; defined in handles


def agree_on(ps: ProcessSet, kind: str, name, tensor=None, op=None, root=-1, free_dim0=False,
             extra=None, problem="", **fields) -> tuple[Verdict, str]:
    """Agree one collective on ``ps``: (verdict, the agreed name)."""
    check_name(kind, name, ps.process_set_id or 0)
    if tensor is not None:
        shape = tuple(tensor.shape)
        fields = {"dtype": C.dtype_name(tensor.dtype),
                  "shape": ("*", *shape[1:]) if free_dim0 else shape, **fields}
    sig = Sig(kind, name or ps.auto_name(kind), op=C.OP_NAMES[op] if op is not None else "",
              root=root, extra=extra, problem=problem, **fields)
    return ps.agree(sig), sig.name


def post(ps: ProcessSet, kind: str, agreed_name: str, held, start) -> int:
    """Post the agreed collective (``start()`` returns its InFlight) and return its handle."""
    t0 = now_if_recording()
    return register(start(), kind, agreed_name, ps.process_set_id or 0, hold=bool(held), t0=t0)


def park(ps: ProcessSet, kind: str, name: str) -> int:
    """The handle of a named call the other ranks met with ``barrier``: pending for good, its
    name held, as in Horovod (:class:`~hpctrain.horovod.handles.Parked`)."""
    return register(Parked(kind, name, ps.rank()), kind, name, ps.process_set_id or 0, hold=True)


# --- allreduce -----------------------------------------------------------------------------
def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set,
                     parkable=False) -> int:
    ps = resolve(process_set)
    C.check(tensor)
    verdict, agreed = agree_on(ps, "allreduce", name, tensor, op, parkable=parkable)
    if verdict.parked:
        return park(ps, "allreduce", agreed)
    return post(ps, "allreduce", agreed, name, lambda: C.post_allreduce(
        ps.comm, tensor, output, op, prescale_factor, postscale_factor))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> int:
    """Start averaging (or ``op``-reducing) ``tensor`` over the set; the input is not modified."""
    op = op_of(op, average)
    return _allreduce_async(tensor, torch.empty_like(tensor), name, op, prescale_factor,
                            postscale_factor, process_set, parkable=bool(name))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> int:
    """In-place :func:`allreduce_async`."""
    op = op_of(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set,
                            parkable=bool(name))


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
    """The average (or ``op``) of ``tensor`` over the set, as a new tensor; differentiable."""
    op = op_of(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


# --- allgather ---------------------------------------------------------------------------------
def _allgather(tensor, name, process_set) -> tuple[int, list[int]]:
    ps = resolve(process_set)
    C.check(tensor)
    rows = tensor.shape[0] if tensor.dim() else 1
    verdict, agreed = agree_on(ps, "allgather", name, tensor, free_dim0=True, extra=rows)
    counts = [e or 0 for e in verdict.extras]
    return post(ps, "allgather", agreed, name, lambda: C.post_allgather(ps.comm, tensor, counts)), counts


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start concatenating every member's ``tensor`` along dimension 0 (sizes may differ)."""
    return _allgather(tensor, name, process_set)[0]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        handle, counts = _allgather(tensor, name, process_set)
        ctx.rows, ctx.process_set = counts, process_set
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        r = resolve(ctx.process_set).rank()
        return reduced.narrow(0, sum(ctx.rows[:r]), ctx.rows[r]), None, None


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Every member's ``tensor`` concatenated along dimension 0; differentiable."""
    return _Allgather.apply(tensor, name, process_set)


# --- broadcast ---------------------------------------------------------------------------------
def _broadcast_async(tensor, output, root_rank, name, process_set) -> int:
    ps = resolve(process_set)
    C.check(tensor)
    root, problem = ps.root_problem(root_rank)
    _, agreed = agree_on(ps, "broadcast", name, tensor, root=root, problem=problem)
    return post(ps, "broadcast", agreed, name,
                lambda: C.post_broadcast(ps.comm, tensor, output, ps.set_rank_of(root)))


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
        ctx.root, ctx.process_set = int(root_rank), process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        ps = resolve(ctx.process_set)
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ps)
        if ps.rank() != ps.set_rank_of(ctx.root):
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """``root_rank``'s ``tensor`` on every member, as a new tensor; differentiable."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


# --- alltoall ------------------------------------------------------------------------------------
def _alltoall_async(tensor, splits, name, process_set) -> int:
    ps = resolve(process_set)
    C.check(tensor)
    n = ps.size()
    rows = tensor.shape[0] if tensor.dim() else 1
    problem, send = "", [0] * n
    if splits is None:
        if rows % n:
            problem = f"alltoall without splits needs dimension 0 ({rows}) divisible by the number of ranks ({n})"
        else:
            send = [rows // n] * n
    elif isinstance(splits, torch.Tensor) and (splits.is_floating_point() or splits.is_complex()):
        problem = f"splits must hold integers, got {C.dtype_name(splits.dtype)}"
    else:
        got = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(got) != n or min(got, default=0) < 0 or sum(got) != rows:
            problem = f"splits {got} must be {n} non-negative counts summing to dimension 0 ({rows})"
        else:
            send = got
    _, agreed = agree_on(ps, "alltoall", name, tensor, free_dim0=True, problem=problem)
    return post(ps, "alltoall", agreed, name, lambda: C.post_alltoall(ps.comm, tensor, send))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Start sending rows of ``tensor`` to every member; :func:`synchronize` returns
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
    """Rows of ``tensor`` scattered to every member (equal shares, or ``splits``), rows from
    every member gathered; with ``splits`` also the rows received from each. Differentiable."""
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# --- reducescatter ---------------------------------------------------------------------------
def reducescatter_problem(tensor, op) -> str:
    """What is wrong with this rank's reducescatter arguments ("" if nothing); agreed, so a
    problem on one rank raises the same ValueError on every rank."""
    if op not in (Average, Sum):
        return "reducescatter supports op=Average and op=Sum"
    if tensor.dim() == 0:
        return "reducescatter needs a tensor of at least one dimension"
    return ""


def _reducescatter_async(tensor, name, op, prescale, postscale, process_set) -> int:
    ps = resolve(process_set)
    C.check(tensor)
    # Agreed, not raised here: a rank that raised alone would leave the others in the agreement.
    _, agreed = agree_on(ps, "reducescatter", name, tensor, op, problem=reducescatter_problem(tensor, op))
    return post(ps, "reducescatter", agreed, name,
                lambda: C.post_reducescatter(ps.comm, tensor, op, prescale, postscale))


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> int:
    return _reducescatter_async(tensor, name, op_of(op, None), prescale_factor, postscale_factor,
                                process_set)


def reducescatter_grad_factor(op, prescale, postscale, process_set) -> float:
    """Horovod's reducescatter gradient: allgather, times the set's size for Sum, times scales."""
    return prescale * postscale * (resolve(process_set).size() if op == Sum else 1)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.factor = reducescatter_grad_factor(op, prescale, postscale, process_set)
        ctx.process_set = process_set
        return synchronize(_reducescatter_async(tensor, name, op, prescale, postscale, process_set))

    @staticmethod
    def backward(ctx, grad):
        return allgather(grad.contiguous(), process_set=ctx.process_set) * ctx.factor, \
            None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce ``tensor`` over the set and keep this member's rows (the first ``rows % size``
    members one row more); differentiable."""
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op_of(op, None), prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(out, ctx)
