"""Run metrics: ``RUN_DIR/metrics.jsonl``, one JSON object a line, written by rank 0.

Lines carry an ``event`` ("config", "epoch", "eval", "summary"…); the last line of a finished
run is the summary. Each line is flushed so a killed job keeps what it had.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from types import MappingProxyType


class MetricsLog:
    def __init__(self, run_dir: str, enabled: bool, append: bool = False):
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self._fh = None
        if enabled:
            os.makedirs(run_dir, exist_ok=True)
            self._fh = open(self.path, "a" if append else "w")   # a resumed run continues the log

    def log(self, event: str, **fields) -> dict:
        rec = {"event": event, "time": time.time(), **fields}
        if self._fh:
            self._fh.write(json.dumps(rec) + "\n")
            self._fh.flush()
        return rec

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None


def gpu_time(wall_s: float, world_size: int, epochs: float) -> dict:
    """Seed 000's "actual average single-GPU training time" (DESIGN.md): wall × ranks, per epoch."""
    total = wall_s * world_size
    return {"gpu_time_s": total, "avg_single_gpu_time_per_epoch_s": total / epochs if epochs else 0.0}


class StepTimer:
    """Wall time per phase ("data", "forward", "backward", "allreduce", "optimizer", …).

    ``with timer.span("forward"):`` accumulates into the current breakdown; ``sinks`` receive
    ``(name, start_s, duration_s)`` for every span (a timeline writer is one such sink).
    """

    def __init__(self, sinks=()):
        self.totals: dict[str, float] = {}
        self.sinks = list(sinks)

    def span(self, name: str):
        return _Span(self, name)

    def add(self, name: str, start_s: float, duration_s: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + duration_s
        for sink in self.sinks:
            sink(name, start_s, duration_s)

    def reset(self) -> dict:
        """Return the breakdown so far and start a new one."""
        out, self.totals = self.totals, {}
        return out


class _Span:
    __slots__ = ("timer", "name", "t0")

    def __init__(self, timer: StepTimer, name: str):
        self.timer, self.name = timer, name

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.timer.add(self.name, self.t0, time.perf_counter() - self.t0)


class NullTimer:
    """A :class:`StepTimer` that records nothing: the default of classes given no timer. It holds
    no state (no totals, no sinks, no attributes can be set), so one instance is shared safely."""
    __slots__ = ()
    sinks = ()
    totals = MappingProxyType({})
    _NO_SPAN = contextlib.nullcontext()

    def span(self, name: str):
        return self._NO_SPAN

    def add(self, name: str, start_s: float, duration_s: float) -> None:
        pass

    def reset(self) -> dict:
        return {}


NULL_TIMER = NullTimer()
