"""Run metrics: ``RUN_DIR/metrics.jsonl``, one JSON object a line, written by rank 0.

Lines carry an ``event`` ("config", "epoch", "eval", "summary"…); the last line of a finished
run is the summary. Each line is one ``write`` of the whole line (:func:`~hpctrain.ops.fileio.append_whole`):
a killed job keeps what it had, and a write that fails (a full disk, an immutable file) leaves no
half line: the job stops with one line naming the file (status 2). A fresh start in a directory
that holds another run's history moves that history aside first (:func:`set_history_aside`).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from types import MappingProxyType
from typing import Any

from hpctrain.ops.fileio import WriteError, append_whole, open_append, why

METRICS_NAME = "metrics.jsonl"


def set_history_aside(path: str) -> str | None:
    """Move a non-empty ``path`` (an earlier run's history) to ``metrics-<run id>.jsonl`` beside it
    (``metrics-<run id>.<n>.jsonl`` if taken; never over anything: a hard link, then an unlink);
    returns the new path, or None if there was nothing to keep. Call holding the run directory."""
    try:
        if os.lstat(path).st_size == 0:
            return None
    except FileNotFoundError:
        return None
    first = next(iter(read_records(os.path.dirname(path), limit=1)), {})
    run_id = first.get("run_id")
    safe = isinstance(run_id, str) and re.fullmatch(r"[0-9A-Za-z_-]{1,64}", run_id)   # a file name, no path
    stem = os.path.join(os.path.dirname(path), f"metrics-{run_id if safe else 'earlier'}")
    for n in range(10_000):
        target = f"{stem}.jsonl" if not n else f"{stem}.{n}.jsonl"
        try:
            os.link(path, target, follow_symlinks=False)
        except FileExistsError:
            continue
        except OSError:                         # no hard links here (some FUSE mounts): a rename to a free name
            if os.path.lexists(target):
                continue
            os.rename(path, target)
            return target
        os.unlink(path)
        return target
    raise FileExistsError(f"{stem}.*.jsonl: no free name")


class MetricsLog:
    """``append``: continue the file (a resume); else a fresh start, the earlier history set aside."""

    def __init__(self, run_dir: str, enabled: bool, append: bool = False):
        self.enabled = enabled
        self.path = os.path.join(run_dir, METRICS_NAME)
        self.kept_as: str | None = None          # where a fresh start put the earlier history
        self._fd: int | None = None
        self.observers: list = []     # each gets every record (``observer.record(rec)``), e.g. TensorBoard's
        if enabled:
            try:
                os.makedirs(run_dir, exist_ok=True)
                if not append:
                    self.kept_as = set_history_aside(self.path)
                self._fd = open_append(self.path)     # any resume continues the log, never clears it
            except OSError as exc:
                raise WriteError(why(exc, self.path)) from None
            if self.kept_as:
                print(f"hpctrain: note: {self.path} held an earlier run's history: kept as {self.kept_as}",
                      file=sys.stderr, flush=True)

    def log(self, event: str, **fields) -> dict:
        rec = {"event": event, "time": time.time(), **fields}
        if self._fd is not None:
            try:
                append_whole(self._fd, (json.dumps(rec) + "\n").encode())
            except OSError as exc:
                self.close()                     # no second try on the way out
                raise WriteError(f"{why(exc, self.path)}; the records before this one are whole, the "
                                 f"checkpoints written are kept (--resume auto continues)") from None
        for observer in self.observers:
            observer.record(rec)
        return rec

    def observe(self, event: str, **fields) -> None:
        """A record for the observers alone (per-step figures: too many for ``metrics.jsonl``)."""
        for observer in self.observers:
            observer.record({"event": event, **fields})

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def read_records(run_dir: str, limit: int | None = None) -> list[dict]:
    """The records of ``RUN_DIR/metrics.jsonl`` so far (none if it is missing; the first ``limit``);
    a line that is not a JSON object (a leg killed mid-write) is left out, not an error: this is
    history, read at a resume."""
    out: list[dict] = []
    try:
        with open(os.path.join(run_dir, METRICS_NAME)) as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
                if limit is not None and len(out) >= limit:
                    break
    except OSError:
        pass
    return out


def gpu_time(wall_s: float, world_size: int, epochs: float) -> dict:
    """Seed 000's "actual average single-GPU training time" (docs/operations.md): wall × ranks, per epoch."""
    total = wall_s * world_size
    return {"gpu_time_s": total, "avg_single_gpu_time_per_epoch_s": total / epochs if epochs else 0.0}


class HostClock:
    """Phase boundaries on the host clock: what a CPU run spends in each phase."""
    deferred = False

    def mark(self) -> float:
        return time.perf_counter()

    def ready(self, mark) -> bool:
        return True

    def seconds(self, a, b) -> float:
        return b - a

    def start_s(self, a) -> float:
        return a


class CudaClock:
    """Phase boundaries as CUDA events on the current stream: what the *GPU* spends in each
    phase. On a GPU the host only queues kernels, so host time would credit "forward" and
    "backward" with launch time and "allreduce" with the backward it waits for; events time the
    device's own work (and, around "data", how long it sat idle waiting for a batch). Durations
    are known once the end event has completed: :class:`StepTimer` collects them without
    blocking and waits only in ``reset``. ``event`` makes a timing event (tests: a fake)."""
    deferred = True

    def __init__(self, device=None, event=None):
        import torch
        self.event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.anchor, self.anchor_host = self.mark(), time.perf_counter()

    def mark(self) -> Any:
        e = self.event()
        e.record()
        return e

    def ready(self, mark) -> bool:
        return mark.query()

    def seconds(self, a, b) -> float:
        b.synchronize()
        return a.elapsed_time(b) / 1000.0

    def start_s(self, a) -> float:
        """Host-clock seconds of ``a`` (the timeline's axis), from an anchor recorded at start."""
        return self.anchor_host + self.anchor.elapsed_time(a) / 1000.0


def clock_for(device) -> HostClock | CudaClock:
    """CUDA events where the model trains on a CUDA device, else the host clock."""
    return CudaClock(device) if getattr(device, "type", str(device)) == "cuda" else HostClock()


class StepTimer:
    """Time per phase ("data", "forward", "backward", "allreduce", "optimizer", …): the host's
    wall time, or with a :class:`CudaClock` (:func:`clock_for` a CUDA device) the GPU's.

    ``with timer.span("forward"):`` accumulates into the current breakdown; ``sinks`` receive
    ``(name, start_s, duration_s)`` for every span (a timeline writer is one such sink), with
    device timing once the span's end event has completed (checked, never waited for, at each
    span's end; :meth:`reset` waits for the rest).
    """

    def __init__(self, sinks=(), clock=None):
        self.totals: dict[str, float] = {}
        self.sinks = list(sinks)
        self.clock = clock or HostClock()
        self._pending: list[tuple] = []     # (name, start mark, end mark) not resolved yet (device)

    def span(self, name: str) -> _Span:
        return _Span(self, name)

    def add(self, name: str, start_s: float, duration_s: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + duration_s
        for sink in self.sinks:
            sink(name, start_s, duration_s)

    def finished(self, name: str, a, b) -> None:
        """A span from mark ``a`` to mark ``b`` has ended (on the host)."""
        if not self.clock.deferred:
            self.add(name, self.clock.start_s(a), self.clock.seconds(a, b))
            return
        self._pending.append((name, a, b))
        self._resolve(block=False)

    def _resolve(self, block: bool) -> None:
        while self._pending and (block or self.clock.ready(self._pending[0][2])):
            name, a, b = self._pending.pop(0)
            self.add(name, self.clock.start_s(a), self.clock.seconds(a, b))

    def reset(self) -> dict:
        """Return the breakdown so far and start a new one."""
        self._resolve(block=True)
        out, self.totals = self.totals, {}
        return out


class _Span:
    __slots__ = ("timer", "name", "t0")

    def __init__(self, timer: StepTimer, name: str):
        self.timer, self.name = timer, name

    def __enter__(self):
        self.t0 = self.timer.clock.mark()
        return self

    def __exit__(self, *exc):
        self.timer.finished(self.name, self.t0, self.timer.clock.mark())


class NullTimer:
    """A :class:`StepTimer` that records nothing: the default of classes given no timer. It holds
    no state (no totals, no sinks, no attributes can be set), so one instance is shared safely."""
    __slots__ = ()
    sinks = ()
    totals: MappingProxyType[str, float] = MappingProxyType({})
    _NO_SPAN = contextlib.nullcontext()

    def span(self, name: str) -> contextlib.nullcontext[None]:
        return self._NO_SPAN

    def add(self, name: str, start_s: float, duration_s: float) -> None:
        pass

    def reset(self) -> dict:
        return {}


NULL_TIMER = NullTimer()

#: what a class given a ``timer`` accepts: a real one, or the shared no-op default
Timer = StepTimer | NullTimer
