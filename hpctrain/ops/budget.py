"""Where a step's time goes: an exclusive-time recorder of named phases, per bucket.

The trainer's timer seam (``with timer.span("forward")``) and the gradient sync's probe seam
(``with probe.span("pack", bucket_index)``) both take a :class:`PhaseBudget` when a benchmark
asks for the budget (``bench step --budget``); otherwise they hold :data:`NULL_PROBE` /
:data:`hpctrain.ops.metrics.NULL_TIMER`, which record nothing and cost a shared
``nullcontext``.

Exclusive time: at every instant exactly one phase is charged, the innermost span still open
(the step itself, ``"other"``, when none is). So the phases of a step add up to its wall time by
construction, nested spans are never counted twice (``allreduce`` holds only what its ``pack``,
``reduce.*``, ``wait`` and ``unpack`` spans do not), and the bookkeeping can be checked against
an independent clock (:meth:`PhaseBudget.step` returns the step's wall time measured around it).
Spans must nest (open and close in LIFO order); a reduction generator therefore never holds a
span across a ``yield``: what it is about to wait for is a *tag* (:meth:`PhaseBudget.tag`),
read by the instrumented :class:`~hpctrain.comm.progress.Pending` when it blocks.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict

OTHER = "other"
NO_BUCKET = -1


class PhaseBudget:
    """Exclusive seconds per ``(phase, bucket)``; ``sinks`` get ``(name, start_s, duration_s)``
    of every closed span, as :class:`hpctrain.ops.metrics.StepTimer`'s do (a timeline)."""

    def __init__(self, sinks=(), clock=time.perf_counter):
        self.clock = clock
        self.sinks = list(sinks)
        self.totals: dict[tuple[str, int], float] = defaultdict(float)
        self.counts: dict[tuple[str, int], int] = defaultdict(int)
        self._stack: list[tuple[str, int]] = []
        self._tags: dict[int, str] = {}
        self._last = clock()

    def _charge(self, now: float) -> None:
        key = self._stack[-1] if self._stack else (OTHER, NO_BUCKET)
        self.totals[key] += now - self._last
        self._last = now

    @contextlib.contextmanager
    def span(self, name: str, bucket: int = NO_BUCKET):
        """Charge the time inside (minus inner spans) to ``(name, bucket)``."""
        t0 = self.clock()
        self._charge(t0)
        self._stack.append((name, bucket))
        self.counts[(name, bucket)] += 1
        try:
            yield
        finally:
            t1 = self.clock()
            self._charge(t1)
            self._stack.pop()
            for sink in self.sinks:
                sink(name if bucket == NO_BUCKET else f"{name}[{bucket}]", t0, t1 - t0)

    def tag(self, bucket: int, phase: str | None) -> None:
        """What bucket ``bucket``'s reduction waits for from now on (None: its default level)."""
        if phase is None:
            self._tags.pop(bucket, None)
        else:
            self._tags[bucket] = phase

    def tagged(self, bucket: int, default: str) -> str:
        return self._tags.get(bucket, default)

    def step(self, run) -> float:
        """Run ``run()`` as one step and return its wall time; the time before (between steps)
        is not charged."""
        self._last = t0 = self.clock()
        run()
        t1 = self.clock()
        self._charge(t1)
        return t1 - t0

    def reset(self) -> dict[tuple[str, int], float]:
        """The totals so far, and start again."""
        out = dict(self.totals)
        self.totals.clear()
        self.counts.clear()
        self._tags.clear()
        self._last = self.clock()
        return out


class NullProbe:
    """Records nothing; the default probe of a gradient sync. Stateless: shared safely."""
    __slots__ = ()
    _NO_SPAN = contextlib.nullcontext()

    def span(self, name: str, bucket: int = NO_BUCKET) -> contextlib.nullcontext[None]:
        return self._NO_SPAN

    def tag(self, bucket: int, phase: str | None) -> None:
        pass


NULL_PROBE = NullProbe()
