"""Cooperative progress for non-blocking reductions written as generators.

A reduction algorithm is a generator that posts non-blocking MPI operations and ``yield``s the
list of requests it needs before it can go on; it ``return``s its result (the overflow flag).
Written this way the *same* code runs blocking (driven by :func:`wait_all`) and overlapped with
backward (poll with ``Testall`` from gradient hooks), so both paths do identical arithmetic in
identical order and give bit-identical results. No progress thread is needed: the hooks fire
once per parameter during backward, and Open MPI's non-blocking operations advance inside
``Test``/``Wait`` calls anyway, so polling is what makes them progress.

Besides MPI requests a generator may yield other waitables: objects with ``test()`` (never
blocks; True once complete) and ``wait()``, such as a staged bucket's device-to-host copy
(:class:`hpctrain.comm.staging.Ready`, a CUDA event).
"""
from __future__ import annotations

import os
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

if TYPE_CHECKING:
    import torch

# What a strategy's ``reduce_bucket`` is: yields lists of waitables, returns the overflow flag: a
# host bool, or for buckets in device memory a 0-d bool tensor there (read once per round:
# hpctrain.comm.streams.any_flag).
Reduction = Generator[list, None, "bool | torch.Tensor"]


def test_all(reqs) -> bool:
    """``MPI.Request.Testall`` over ``reqs``, other waitables tested by their ``test()``."""
    others = [r for r in reqs if not isinstance(r, MPI.Request)]
    if not others:
        return MPI.Request.Testall(reqs)
    done = MPI.Request.Testall([r for r in reqs if isinstance(r, MPI.Request)])
    return all([w.test() for w in others]) and done


def wait_all(reqs) -> None:
    """Wait for ``reqs``: other waitables by their ``wait()``; MPI requests by ``Testall`` with
    the core given up between tests (``sched_yield``), never by ``Waitall``.

    Open MPI's ``Waitall`` spins in its progress loop at full speed unless the job set
    ``mpi_yield_when_idle`` (it does so by itself only when it knows the node is
    oversubscribed). A rank that reaches a node barrier first would spin on a core that the
    other rank's backward, a data-loader worker or a decode thread needs on a fully used node;
    yielding costs a system call per test where nothing else wants the core."""
    others = [r for r in reqs if not isinstance(r, MPI.Request)]
    for w in others:
        w.wait()
    mpi_reqs = [r for r in reqs if isinstance(r, MPI.Request)] if others else reqs
    while not test_all(mpi_reqs):
        os.sched_yield()


class Pending:
    """One reduction in flight: its generator and the requests it is waiting on."""

    __slots__ = ("gen", "reqs", "done", "value")

    def __init__(self, gen):
        self.gen, self.reqs, self.done, self.value = gen, [], False, None
        self._run()

    def _run(self) -> None:
        """Advance the generator until it waits on requests that are not complete yet."""
        while True:
            try:
                reqs = next(self.gen)
            except StopIteration as stop:
                self.done, self.value, self.reqs = True, stop.value, []
                return
            if not test_all(reqs):
                self.reqs = reqs
                return

    def poll(self) -> bool:
        """Make progress without blocking; True once the reduction is complete."""
        if not self.done and test_all(self.reqs):
            self._run()
        return self.done

    def wait(self) -> Any:
        """Block until complete; returns the generator's result."""
        while not self.done:
            wait_all(self.reqs)
            self._run()
        return self.value


class TimedPending(Pending):
    """A :class:`Pending` whose time goes to a budget (:class:`hpctrain.ops.budget.PhaseBudget`):
    advancing the generator to ``level`` (the reduction's own work), testing for completion to
    ``"wait"``, blocking to what the generator tagged it is waiting for (``level`` if nothing:
    a ring's messages are its reduction)."""

    __slots__ = ("probe", "bucket", "level")

    def __init__(self, gen, probe, bucket: int, level: str):
        self.probe, self.bucket, self.level = probe, bucket, level
        super().__init__(gen)

    def _run(self) -> None:
        with self.probe.span(self.level, self.bucket):
            super()._run()

    def poll(self) -> bool:
        if self.done:
            return True
        with self.probe.span("wait", self.bucket):
            return super().poll()

    def wait(self) -> Any:
        while not self.done:
            with self.probe.span(self.probe.tagged(self.bucket, self.level), self.bucket):
                wait_all(self.reqs)
            self._run()
        return self.value


def run(gen: Generator[list, None, Any]) -> Any:
    """Drive a reduction generator to completion (the blocking path)."""
    return Pending(gen).wait()
