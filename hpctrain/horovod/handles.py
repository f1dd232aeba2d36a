"""Horovod's integer handles for asynchronous collectives: :func:`poll` and :func:`synchronize`,
and what a handle holds: an :class:`InFlight` collective (its MPI requests and the step that
turns the received buffers into the result).

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
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from hpctrain.horovod import timeline as T
from hpctrain.horovod.errors import HorovodInternalError


class InFlight:
    """A collective in flight: ``poll()`` without blocking, ``wait()`` for the result.

    ``keep`` holds the buffers MPI reads until the requests complete: mpi4py does not keep a
    non-blocking collective's buffers alive, so an async call on a temporary tensor would
    otherwise send freed (reused) memory."""

    __slots__ = ("reqs", "finish", "result", "done", "keep", "t0")

    def __init__(self, reqs: list, finish: Callable[[], object], keep: tuple = ()):
        self.reqs, self.done, self.keep = reqs, False, keep
        self.t0 = 0.0                       # when posted, where a timeline records (register)
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
