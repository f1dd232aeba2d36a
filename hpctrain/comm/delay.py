"""A slow link on one host: injected latency for gradient allreduces (config ``comm.delay_ms``;
it wraps any gradient sync, so it lives with them).

Model: a bucket's mean is available no earlier than ``delay`` after the bucket was started —
completion = max(real completion, start + delay). The real reduction runs underneath as usual;
the delay is a latency floor, like a long-haul link whose wire time dwarfs the transfer. A wait
that begins later waits less, so computation placed between starting a reduction and waiting
for it hides the latency, exactly as on a real slow network — which a ``sleep`` inside the
allreduce would not show. The remaining time is slept (no CPU burnt: on an oversubscribed host
the other ranks keep computing).

:class:`DelayedSync` composes a gradient sync (``hpctrain.comm.GradSync``) with explicit methods,
no attribute proxy. Start times come from ``GradSync.on_start``, a callback list the sync calls
whenever a bucket starts (by ``begin`` or by a backward hook), so overlapped buckets are timed too.
"""
from __future__ import annotations

import time

from hpctrain.comm.base import GradSync


class DelayedSync:
    """``inner`` with every bucket's mean held back until ``delay_ms`` after the bucket started."""

    def __init__(self, inner, delay_ms: float, *, clock=time.perf_counter, sleep=time.sleep):
        if not delay_ms >= 0:
            raise ValueError(f"comm.delay_ms (comm_delay_ms): must be >= 0, got {delay_ms}")
        self.inner, self.delay_s = inner, delay_ms / 1e3
        self._clock, self._sleep = clock, sleep
        self._started_s: dict[int, float] = {}      # bucket index -> start time, this round
        inner.on_start.append(self._started)        # GradSync calls it when a bucket starts

    def _started(self, index: int) -> None:
        self._started_s[index] = self._clock()

    # --- what the update algorithms use (the GradSync interface) --------------------------------
    @property
    def params(self) -> list:
        return self.inner.params

    @property
    def buckets(self) -> list:
        return self.inner.buckets

    @property
    def started(self) -> list[int]:
        return self.inner.started

    @property
    def closed(self) -> bool:
        return self.inner.closed

    def deadline_s(self) -> float | None:
        """When the round's last started bucket may complete (None: nothing started)."""
        if not self._started_s:
            return None
        return max(self._started_s.values()) + self.delay_s

    def begin(self) -> None:
        self.inner.begin()

    def poll_reduction(self) -> bool:
        """The real reduction only (the delay's remainder is slept in ``finish``, not spun)."""
        return self.inner.poll_reduction()

    def poll(self) -> bool:
        done = self.inner.poll()
        deadline = self.deadline_s()
        return done and (deadline is None or self._clock() >= deadline)

    def finish(self, scatter: bool = True, check: bool = True) -> bool:
        """Wait for the real reduction, then for whatever is left of the delay."""
        self.inner.begin()                  # every bucket started: the deadline is known
        deadline = self.deadline_s()
        found_inf = self.inner.finish(scatter=scatter, check=check)
        self._started_s.clear()
        if deadline is not None:
            remaining_s = deadline - self._clock()
            if remaining_s > 0:
                self._sleep(remaining_s)
        return found_inf

    def scatter_means(self) -> None:
        self.inner.scatter_means()

    def describe(self) -> str:
        return f"{self.inner.describe()}; emulated link delay {self.delay_s * 1e3:g} ms"

    def allreduce_grads(self) -> bool:
        self.begin()
        return self.finish(scatter=True)

    def handles(self) -> list:
        return self.inner.handles()

    def close(self) -> None:
        self.inner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def with_comm_delay(sync: GradSync, delay_ms: float) -> GradSync | DelayedSync:
    """``sync`` itself when ``delay_ms`` is 0, else a :class:`DelayedSync` around it."""
    return DelayedSync(sync, delay_ms) if delay_ms else sync
