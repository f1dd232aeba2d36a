"""Horovod's helpers for whole models and Python objects.

``broadcast_parameters`` agrees once for the whole set (names, shapes and dtypes compared by
digest), then broadcasts every tensor in place. ``broadcast_optimizer_state`` does what
Horovod's does: an optimizer with no state yet is first stepped once with zero gradients on
every parameter that requires one (so its state exists and ``p.grad`` is a zero tensor, as
under Horovod; parameters that need no gradient keep ``grad=None``), then the root's
``optimizer.state_dict()`` (every option value, e.g. a changed ``lr``, and every state tensor)
is loaded everywhere.
"""
from __future__ import annotations

import hashlib
from typing import Any

import torch

from hpctrain.horovod.coordinator import Sig
from hpctrain.horovod.process_sets import global_process_set, resolve
from hpctrain.horovod.torch import collectives as C


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
    ps = resolve(process_set)
    named = _named(params)
    root, problem = ps.root_problem(root_rank)
    ps.agree(Sig("broadcast_parameters", f"{len(named)} tensors", shape=(_digest(named),), root=root,
                 problem=problem))
    pending = [C.post_broadcast(ps.comm, t.data if isinstance(t, torch.nn.Parameter) else t,
                                t.data if isinstance(t, torch.nn.Parameter) else t, ps.set_rank_of(root))
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


def _create_state(optimizer) -> None:
    """Horovod's first step of a fresh optimizer: a zero gradient on every parameter that needs
    one (replacing any gradient a backward pass left: a step with this rank's own gradient would
    move its weights alone), one step of the wrapped optimizer (never the distributed one: no
    reduction). As in Horovod the gradients stay zero afterwards."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    inner = getattr(optimizer, "_inner", optimizer)
    inner.step()


def broadcast_optimizer_state(optimizer, root_rank: int, model=None, process_set=global_process_set) -> None:
    """Make every member's optimizer options and state ``root_rank``'s (exactly)."""
    ps = resolve(process_set)
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _create_state(optimizer)
    is_root = ps.rank() == ps.set_rank_of(int(root_rank))
    sd = _cpu(optimizer.state_dict()) if is_root else None
    sd = broadcast_object(sd, root_rank, name="optimizer_state", process_set=ps)
    if not is_root:
        optimizer.load_state_dict(sd)


def broadcast_object(obj, root_rank: int = 0, name=None, process_set=global_process_set) -> Any:
    """``root_rank``'s ``obj`` (pickled) on every member."""
    ps = resolve(process_set)
    root, problem = ps.root_problem(root_rank)
    ps.agree(Sig("broadcast_object", name or ps.auto_name("broadcast_object"), root=root, problem=problem))
    return ps.comm.bcast(obj, root=ps.set_rank_of(root))


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every member's ``obj`` (pickled), in the set's rank order."""
    ps = resolve(process_set)
    ps.agree(Sig("allgather_object", name or ps.auto_name("allgather_object")))
    return ps.comm.allgather(obj)
