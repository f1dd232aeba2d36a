"""``barrier`` and ``join``: a joined rank takes part in the others' reductions until all join.

As in Horovod, while some rank has joined the others may still allreduce (joined ranks add the
op's identity: zeros to sums; an ``Average`` still divides by every rank), run optimizer steps
(joined ranks add zero gradients) and barriers; any other collective (allgather, broadcast,
alltoall, reducescatter, the object helpers) raises on the ranks that asked for it, while the
joined rank waits on in ``join``.
"""
from __future__ import annotations

import torch

from hpctrain.horovod.torch import buffers as B
from hpctrain.horovod.torch import collectives as C
from hpctrain.horovod.torch.basics import state
from hpctrain.horovod.torch.coordinator import Sig
from hpctrain.horovod.torch.process_sets import global_process_set, resolve

MIRRORED = ("allreduce", "grouped_allreduce", "barrier", "grad")


def barrier(process_set=global_process_set) -> None:
    """Wait until every member of the set has reached the barrier."""
    ps = resolve(process_set)
    ps.agree(Sig("barrier", "barrier"))
    C.post_barrier(ps.comm).wait()


def join(device=-1) -> int:
    """This rank has no more data: until every rank has joined, take part in the others'
    reductions with a neutral contribution. Returns the rank that joined last."""
    ps = resolve(global_process_set)
    while True:
        verdict = ps.agree(Sig("join", "join"))
        if verdict.last_joined >= 0:
            return verdict.last_joined
        for name in verdict.names or ((verdict.sig.name,) if verdict.sig is not None else ()):
            _follow_auto_name(name)
        if verdict.error is None:             # else the others raise theirs; this rank waits on
            _mirror(verdict)


def _mirror(verdict) -> None:
    """A joined rank's part in the collective ``verdict.sig`` the active ranks run."""
    sig, comm = verdict.sig, global_process_set.comm
    op = {v: k for k, v in B.OP_NAMES.items()}.get(sig.op, B.Sum)
    if sig.kind == "allreduce":
        t = B.neutral(op, getattr(torch, sig.dtype), sig.shape)
        C.post_allreduce(comm, t, t, op).wait()
    elif sig.kind == "grouped_allreduce":
        ts = [B.neutral(op, getattr(torch, d), s) for d, s in zip(sig.dtype.split(","), sig.shape)]
        C.post_grouped_allreduce(comm, ts, ts, op).wait()
    elif sig.kind == "barrier":
        C.post_barrier(comm).wait()
    elif sig.kind == "grad":
        state().optimizers[sig.name].mirror_round()


def _follow_auto_name(name: str) -> None:
    """A joined rank does not make the unnamed calls the others make (failed ones included):
    advance its counter past theirs, so automatic names (``allreduce.noname.N``) still agree once
    every rank has joined."""
    _, sep, number = name.rpartition(".noname.")
    if sep and number.isdigit():
        counters = global_process_set.counters
        counters["noname"] = max(counters.get("noname", 0), int(number) + 1)


def refuse_joined(sig: Sig, joined: tuple) -> str | None:
    """Why ``sig`` cannot run while ``joined`` ranks have joined (None: it can)."""
    if sig.kind in MIRRORED:
        return None
    return "as in Horovod, only allreduce, grouped_allreduce, barrier and optimizer steps run while a rank has joined"
