"""Per-rank phase timeline in the Chrome trace format, merged into ``RUN_DIR/timeline.json``.

A :class:`Timeline` is a :class:`~hpctrain.ops.metrics.StepTimer` sink: every span (data wait,
forward, backward, allreduce, optimizer, checkpoint) becomes a complete event (``"ph": "X"``)
with the rank as the process, so Perfetto (https://ui.perfetto.dev) or ``chrome://tracing``
shows one row per rank, stacked — a straggler or a rank waiting in the allreduce stands out.
Format: the Trace Event Format document ("JSON Object Format", ``traceEvents``, microsecond
``ts``/``dur``); Horovod's ``HOROVOD_TIMELINE`` writes the same format.

Clocks: each rank's origin is the exit of a common ``Barrier``, so times are comparable across
ranks and hosts to within the barrier's skew (microseconds on one host). Events are kept as
compact arrays, capped at ``max_events`` per rank (the count dropped is recorded), and gathered
to rank 0 once, at the end.
"""
from __future__ import annotations

import json
import time
from array import array

from mpi4py import MPI

from hpctrain.ops.fileio import WriteError, atomic_open, why

DEFAULT_MAX_EVENTS = 200_000


class Timeline:
    """Collect this rank's spans (call it as a sink: ``timeline(name, start_s, duration_s)``)."""

    def __init__(self, comm: MPI.Comm, max_events: int = DEFAULT_MAX_EVENTS, label: str = ""):
        self.rank = comm.Get_rank()
        self.label = label or f"rank {self.rank}"
        self.max_events = max_events
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self.name_ids, self.starts_us, self.durs_us = array("H"), array("d"), array("d")
        self.dropped = 0
        comm.Barrier()
        self.t0 = time.perf_counter()

    def __call__(self, name: str, start_s: float, duration_s: float) -> None:
        if len(self.starts_us) >= self.max_events:
            self.dropped += 1
            return
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        self.name_ids.append(i)
        self.starts_us.append((start_s - self.t0) * 1e6)
        self.durs_us.append(duration_s * 1e6)

    def __len__(self) -> int:
        return len(self.starts_us)

    def packed(self) -> tuple:
        """What crosses the network: names once, then three flat arrays as bytes."""
        return (self.rank, self.label, self.names, self.name_ids.tobytes(), self.starts_us.tobytes(),
                self.durs_us.tobytes(), self.dropped)

    def gather(self, comm: MPI.Comm, root: int = 0) -> list[tuple] | None:
        """Collective: every rank's packed events on ``root`` (None elsewhere)."""
        return comm.gather(self.packed(), root=root)


def chrome_events(packed: tuple) -> list[dict]:
    """One rank's events: process metadata, then a complete event per span."""
    rank, label, names, ids, starts, durs, dropped = packed
    ids, starts, durs = array("H", ids), array("d", starts), array("d", durs)
    meta = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": label}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
    if dropped:
        meta.append({"name": "events dropped", "ph": "i", "s": "p", "pid": rank, "tid": 0,
                     "ts": starts[-1] if starts else 0.0, "args": {"dropped": dropped}})
    return meta + [{"name": names[i], "cat": "phase", "ph": "X", "pid": rank, "tid": 0,
                    "ts": round(s, 3), "dur": round(d, 3)} for i, s, d in zip(ids, starts, durs)]


def write_trace(path: str, per_rank: list[tuple], other: dict | None = None) -> int:
    """Write the merged trace atomically (:mod:`hpctrain.ops.fileio`); returns the event count.
    :class:`~hpctrain.ops.fileio.WriteError` (one line naming the file) if it cannot be written."""
    try:
        return _write_trace(path, per_rank, other)
    except OSError as exc:
        raise WriteError(why(exc, path)) from None


def _write_trace(path: str, per_rank: list[tuple], other: dict | None) -> int:
    n = 0
    with atomic_open(path) as fh:
        fh.write('{"displayTimeUnit": "ms", "otherData": ' + json.dumps(other or {}) + ', "traceEvents": [\n')
        first = True
        for packed in sorted(per_rank, key=lambda p: p[0]):
            for ev in chrome_events(packed):
                fh.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":")))
                first = False
                n += 1
        fh.write("\n]}\n")
    return n


def merge_and_write(timeline: Timeline, comm: MPI.Comm, path: str, other: dict | None = None) -> str | None:
    """Collective: gather every rank's events and write one trace file on rank 0."""
    gathered = timeline.gather(comm)
    if comm.Get_rank() == 0:
        assert gathered is not None         # the root's
        write_trace(path, gathered, {"world_size": comm.Get_size(), **(other or {})})
        return path
    return None
