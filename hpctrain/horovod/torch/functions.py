"""Horovod's helpers for whole models and Python objects.

``broadcast_parameters`` agrees once for the whole set (names, shapes and dtypes compared by
digest), then broadcasts every tensor in place. ``broadcast_optimizer_state`` sends the root's
``optimizer.state_dict()`` and loads it everywhere: every ``torch.optim`` optimizer's options
and state arrive exactly, including non-tensor entries. Unlike Horovod it does not first step a
fresh optimizer with zero gradients to create its state (that step moved weights under weight
decay and counted a step for Adam): an optimizer with no state yet stays without state, on
every rank alike.
"""
from __future__ import annotations

import hashlib
from typing import Any

import torch

from hpctrain.horovod.torch import collectives as C
from hpctrain.horovod.torch.basics import agree, state
from hpctrain.horovod.torch.coordinator import Sig
from hpctrain.horovod.torch.process_sets import check_process_set, global_process_set


def _named(params) -> list[tuple[str | None, torch.Tensor]]:
    if isinstance(params, dict):
        return sorted(params.items())
    if isinstance(params, torch.Tensor):
        raise ValueError(f"invalid params of type: {type(params)}")
    return [p if isinstance(p, tuple) else (None, p) for p in params]


def _digest(named) -> str:
    text = repr([(n, tuple(t.shape), str(t.dtype)) for n, t in named])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def broadcast_parameters(params, root_rank: int, process_set=global_process_set) -> None:
    """Overwrite ``params`` (a ``state_dict()``, ``named_parameters()`` or a list of tensors)
    with ``root_rank``'s, in place."""
    check_process_set(process_set)
    named = _named(params)
    agree(Sig("broadcast_parameters", f"{len(named)} tensors", shape=(_digest(named),), root=int(root_rank)))
    comm = state().comm
    pending = [C.post_broadcast(comm, t.data if isinstance(t, torch.nn.Parameter) else t,
                                t.data if isinstance(t, torch.nn.Parameter) else t, int(root_rank))
               for _, t in named]
    for p in pending:
        p.wait()


def _cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    return value


def broadcast_optimizer_state(optimizer, root_rank: int, model=None, process_set=global_process_set) -> None:
    """Make every rank's optimizer options and state ``root_rank``'s (exactly)."""
    check_process_set(process_set)
    sd = _cpu(optimizer.state_dict()) if state().topo.rank == root_rank else None
    sd = broadcast_object(sd, root_rank, name="optimizer_state")
    if state().topo.rank != root_rank:
        optimizer.load_state_dict(sd)


def broadcast_object(obj, root_rank: int = 0, name=None, process_set=global_process_set) -> Any:
    """``root_rank``'s ``obj`` (pickled) on every rank."""
    check_process_set(process_set)
    agree(Sig("broadcast_object", name or state().auto_name("broadcast_object"), root=int(root_rank)))
    return state().comm.bcast(obj, root=int(root_rank))


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every rank's ``obj`` (pickled), in rank order."""
    check_process_set(process_set)
    agree(Sig("allgather_object", name or state().auto_name("allgather_object")))
    return state().comm.allgather(obj)
