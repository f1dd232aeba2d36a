"""Horovod's integer handles for asynchronous collectives: :func:`poll` and :func:`synchronize`.

A name given to an operation is held from submission until its handle is synchronized: a second
operation with the same name meanwhile raises ``ValueError``, as Horovod's duplicate-name check
does. The rule depends only on the calls a rank made, so every rank raises it alike.

A handle never synchronized still has its MPI requests posted and its buffers held here: at exit
(and at ``shutdown``) :func:`drain` completes them before Python frees the buffers and MPI is
finalized, which otherwise let MPI write into freed memory (a heap corruption at exit).
"""
from __future__ import annotations

import atexit
import itertools
import time
from typing import Any

from mpi4py import MPI

from hpctrain.horovod.torch import timeline as T
from hpctrain.horovod.torch.collectives import InFlight

_handles: dict[int, tuple[InFlight, str, str, tuple | None]] = {}
_names: dict[tuple, int] = {}                 # (set id, kind, name) held -> handle
_next = itertools.count(1)


def check_name(kind: str, name: str | None, set_id: int) -> None:
    """``ValueError`` where ``name`` is held by an operation not yet synchronized."""
    if name and (set_id, kind, name) in _names:
        raise ValueError(f"hpctrain.horovod: requested to {kind} a tensor with the same name as another "
                         f"tensor that is currently being processed ({name!r}); use a different "
                         "name or synchronize the first")


def register(op: InFlight, kind: str = "", name: str = "", set_id: int = 0, hold: bool = False,
             t0: float = 0.0) -> int:
    """A handle for ``op`` (``name``: the agreed name); a user-given name (``hold``) is held
    until :func:`synchronize`."""
    h = next(_next)
    key = (set_id, kind, name) if hold and name else None
    if key is not None:
        _names[key] = h
    _handles[h] = (op, kind, name, key)
    if t0 and T.active() is not None:
        op.t0 = t0
    return h


def poll(handle: int) -> bool:
    """True once the collective behind ``handle`` is done (then :func:`synchronize` won't block)."""
    if handle not in _handles:
        raise ValueError(f"hpctrain.horovod: unknown handle {handle!r}")
    return _handles[handle][0].poll()


def synchronize(handle: int) -> Any:
    """Wait for the collective behind ``handle`` and return its result (None for an unknown
    handle, as Horovod)."""
    entry = _handles.pop(handle, None)
    if entry is None:
        return None
    op, kind, name, key = entry
    if key is not None:
        _names.pop(key, None)
    result = op.wait()
    tl = T.active()
    if tl is not None and op.t0:
        tl.moved(kind, name, op.t0)
    return result


def now_if_recording() -> float:
    """A start time for the timeline's data span (0.0 when no timeline records)."""
    return time.perf_counter() if T.active() is not None else 0.0


def drain() -> None:
    """Complete every posted collective whose handle was never synchronized, and forget the
    handles and names. Each was agreed by every rank before it was posted, so every rank posted it
    and it completes; a parked call posted nothing."""
    for op, *_ in list(_handles.values()):
        if op.reqs and not MPI.Is_finalized():
            MPI.Request.Waitall(op.reqs)
    _handles.clear()
    _names.clear()


atexit.register(drain)      # before module teardown frees the buffers, and before MPI_Finalize
