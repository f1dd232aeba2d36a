"""Horovod's timeline (``HOROVOD_TIMELINE``, ``hvd.start_timeline`` / ``stop_timeline``) written
by hpctrain's own Chrome-trace timeline (:mod:`hpctrain.ops.timeline`).

As in Horovod, the coordinator's rank (rank 0) writes the file: for every collective, a
``NEGOTIATE_<KIND>`` span (the agreement with the other ranks) and a ``<KIND>`` span (the data
moving, from posting to the result being ready), both named with Horovod's operation name
(``allreduce.loss``, ``allreduce.noname.3``); ``mark_cycles`` adds a ``CYCLE_START`` mark at each
agreement (hpctrain has no background cycle: an agreement is its nearest equivalent). The file
is written when the timeline stops: ``stop_timeline``, ``shutdown``, or the end of the process.
Recording is local to rank 0 (nothing collective), so starting or stopping it never waits on
other ranks. ``HOROVOD_TIMELINE=DYNAMIC`` records only between ``start_timeline`` and
``stop_timeline``.
"""
from __future__ import annotations

import atexit
import time

from mpi4py import MPI

from hpctrain.ops.timeline import Timeline, write_trace


class HorovodTimeline:
    """Rank 0's record of its collectives, written as one Chrome trace at ``path``."""

    def __init__(self, path: str, mark_cycles: bool = False):
        self.path, self.mark_cycles = str(path), bool(mark_cycles)
        self.epoch_us = time.time() * 1e6
        self.events = Timeline(MPI.COMM_SELF, label="hpctrain.horovod (rank 0)")

    def negotiated(self, sig, t0: float) -> None:
        now = time.perf_counter()
        if self.mark_cycles:
            self.events("CYCLE_START", t0, 0.0)
        self.events(f"NEGOTIATE_{sig.kind.upper()} {op_name(sig.kind, sig.name)}", t0, now - t0)

    def moved(self, kind: str, name: str, t0: float) -> None:
        self.events(f"{kind.upper()} {op_name(kind, name)}", t0, time.perf_counter() - t0)

    def write(self) -> None:
        write_trace(self.path, [self.events.packed()],
                    {"start_time_since_epoch_in_micros": int(self.epoch_us),
                     "written_by": "hpctrain.horovod"})


def op_name(kind: str, name: str) -> str:
    """Horovod's name for an operation: ``kind.name`` (automatic names already carry the kind)."""
    return name if name.startswith(kind + ".") else f"{kind}.{name}"


_active: HorovodTimeline | None = None
_atexit = False


def active() -> HorovodTimeline | None:
    return _active


def start(path: str, mark_cycles: bool, rank: int) -> None:
    """Start (or restart at a new path) the timeline; only rank 0 records."""
    global _active, _atexit
    stop()
    if rank != 0:
        return
    _active = HorovodTimeline(path, mark_cycles)
    if not _atexit:
        atexit.register(stop)
        _atexit = True


def stop() -> None:
    """Write the file and stop recording (no-op where nothing records)."""
    global _active
    tl, _active = _active, None
    if tl is not None:
        tl.write()
