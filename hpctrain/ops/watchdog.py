"""Stall watchdog: when no rank has made progress for N seconds, say which ranks are behind.

Horovod's stall inspector (``horovod/common/stall_inspector.cc``) has the coordinator list the
ranks that have not submitted a tensor another rank is waiting on. Here each rank posts its
progress — ``step * 64 + spans completed in the step`` — into an MPI-3 one-sided window on rank
0 (``MPI_Accumulate`` with ``MPI_REPLACE``, atomic per element, passive target). A daemon
thread on rank 0 reads that window's local memory (no MPI calls from the thread, so no
``MPI_THREAD_MULTIPLE`` needed; the window is in MPI's unified memory model) and, when the
values have not changed for ``timeout_s``, prints the ranks that have not reached the furthest
rank's point (:mod:`stallreport`), e.g. "no progress for 30 s: rank 3 is after 'forward' of step 57; ranks 0-2, 4-7
wait after 'backward' of step 57" (that is, in the gradient allreduce). Every rank runs the
same phases in the same order, so progress values are comparable across ranks. Cost: one small
one-sided accumulate per phase per rank, small beside a step (measurements: docs/environment.md).

It reports every ``timeout_s``; after ``abort_s`` without progress it ends the job — one line
naming the stalled ranks and where they were, ``on_abort(line)`` (the job records it), then
``MPI_Abort`` with :data:`STALLED_STATUS` — so a rank stopped or hung in place cannot hold a
2,048-rank allocation to its time limit (torch's NCCL watchdog and Horovod's stall inspector end
a job likewise). Both bounds are :data:`ALLOWANCE` times longer while rank 0 is starting up
(until its first step is done) or inside :meth:`busy` (checkpoint writes, evaluation), when long
silences are normal. Rank 0 alone sees every rank; should rank 0 itself be the one stopped, every
other rank watches its own progress and ends the job a margin later (:meth:`_backup_bound`).

Progress alone cannot tell a rank stopped *inside* a collective (after posting its phase) from
the ranks waiting there with it: all show the same point. So every rank other than 0 also posts
a heartbeat (a counter, every poll period) into a second window on rank 0, from a thread of its
own; a waiting rank's thread keeps beating, a stopped, swapped-out or dead one's does not, and
the report names the ranks whose heartbeat has stopped ("rank 1 is after 'backward' of step 51,
silent for 15 s (stopped, or its node is down)"). That thread makes MPI calls beside the main
thread's, so it runs only where MPI provides ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it).
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from hpctrain.ops.stallreport import SLOTS_PER_STEP, compress_ranks, describe_stall

__all__ = ["ALLOWANCE", "SLOTS_PER_STEP", "STALLED_STATUS", "Watchdog", "busy", "compress_ranks", "describe_stall",
           "start_watchdog", "threads_may_call_mpi"]

STALLED_STATUS = 4          # the job's exit status when the watchdog ends it
ALLOWANCE = 3               # the abort bound is this many times longer in start-up and busy phases


def threads_may_call_mpi() -> bool:
    """Whether this MPI lets a second thread make MPI calls beside the main one (heartbeats)."""
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


class Watchdog:
    """Collective constructor; :meth:`step` at each step start and the timer sink on every rank.

    ``timeout_s``: report a stall after that many seconds, and again each period (0: no reports);
    ``abort_s``: end the job after that many (0: never).
    """

    def __init__(self, comm: MPI.Comm, timeout_s: float, report=None, poll_s: float | None = None,
                 abort_s: float = 0.0, on_abort=None):
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout_s, self.abort_s = timeout_s, abort_s
        self.report = report or (lambda text: print(f"hpctrain: watchdog: {text}", file=sys.stderr, flush=True))
        self.on_abort = on_abort
        self.win = MPI.Win.Allocate(8 * self.size if self.rank == 0 else 0, disp_unit=8, comm=self.comm)  # type: ignore[arg-type]  # an Intracomm (stub: Split returns Comm)
        # heartbeats: a window of their own (the main thread's lock epochs on self.win are its own)
        self.beats = threads_may_call_mpi()
        self.beat_win = (MPI.Win.Allocate(8 * self.size if self.rank == 0 else 0, disp_unit=8,
                                          comm=self.comm)  # type: ignore[arg-type]  # an Intracomm (stub: Split returns Comm)
                         if self.beats else MPI.WIN_NULL)
        self._val = np.zeros(1, np.int64)
        self._step, self._k, self._steps_started = 0, 0, 0
        self._busy: str | None = None         # name of the slow phase this rank is in (see busy())
        self.phase_names: list[str] = []      # this rank's span names within a step, in order
        self._names_now: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat_thread: threading.Thread | None = None
        if self.rank == 0:
            self.progress = np.frombuffer(self.win.tomemory(), dtype=np.int64)  # type: ignore[call-overload]  # numpy stub: buffers only on 3.12+
            self.progress[:] = 0
            if self.beats:
                self.heartbeats = np.frombuffer(self.beat_win.tomemory(), dtype=np.int64)  # type: ignore[call-overload]  # numpy stub: buffers only on 3.12+
                self.heartbeats[:] = 0
        self.comm.Barrier()                  # every slot is zero before anyone posts
        bounds = [b for b in (timeout_s, abort_s) if b > 0]
        poll = poll_s if poll_s is not None else min([1.0] + [b / 4 for b in bounds])
        self.beat_s = poll
        target = self._watch if self.rank == 0 else (self._watch_self if abort_s > 0 else None)
        if target is not None:
            self._thread = threading.Thread(target=target, args=(poll,), name="hpctrain-watchdog", daemon=True)
            self._thread.start()
        if self.rank != 0 and self.beats and bounds:
            # a thread apart from the watching one: should rank 0 be stopped, a post may block
            self._beat_thread = threading.Thread(target=self._beat, args=(poll,), name="hpctrain-heartbeat",
                                                 daemon=True)
            self._beat_thread.start()

    def _post(self) -> None:
        self._val[0] = self._step * SLOTS_PER_STEP + min(self._k, SLOTS_PER_STEP - 1)
        self.win.Lock(0, MPI.LOCK_SHARED)
        self.win.Accumulate(self._val, 0, target=(self.rank, 1, MPI.INT64_T), op=MPI.REPLACE)
        self.win.Unlock(0)

    def _beat(self, period_s: float) -> None:
        """Ranks other than 0, in their own thread: a counter into rank 0's heartbeat window
        every ``period_s``, whatever the main thread is doing (waiting in a collective included)."""
        beat = np.zeros(1, np.int64)
        # one epoch for the thread's life, flushed per beat: cheaper for the main thread than a lock
        # and unlock per beat, which slowed the main thread's steps under MPICH (measurements:
        # docs/environment.md)
        self.beat_win.Lock_all()
        try:
            while not self._stop.wait(period_s):
                beat[0] += 1
                self.beat_win.Accumulate(beat, 0, target=(self.rank, 1, MPI.INT64_T), op=MPI.REPLACE)
                self.beat_win.Flush(0)
        finally:
            self.beat_win.Unlock_all()

    def step(self, step: int) -> None:
        """This rank starts ``step``."""
        if self._names_now and self._steps_started:
            self.phase_names = self._names_now
        self._step, self._k, self._names_now = step, 0, []
        self._steps_started += 1
        self._post()

    def __call__(self, name: str, start_s: float, duration_s: float) -> None:
        """StepTimer sink: this rank finished phase ``name`` of the current step."""
        self._k += 1
        self._names_now.append(name)
        self._post()

    @contextlib.contextmanager
    def busy(self, name: str) -> Iterator[None]:
        """Every rank, around a phase that may be long with no step progress (a checkpoint write,
        an evaluation): the bounds are :data:`ALLOWANCE` times longer inside it."""
        self._busy = name
        try:
            yield
        finally:
            self._busy = None
            self(name, 0.0, 0.0)              # done: that is progress

    def _allowance(self) -> float:
        """How many times the bounds are longer now: :data:`ALLOWANCE` in start-up (before this
        rank's first step is done) and busy phases, else 1."""
        return ALLOWANCE if self._steps_started < 2 or self._busy is not None else 1

    def _backup_bound(self) -> float:
        """A rank other than 0 ends the job itself this much later than rank 0 would have."""
        return self.abort_s * self._allowance() * 1.1 + 10

    def _end_job(self, text: str) -> None:
        """Say why (one line), let the job record it, give the launcher time to pass the line on,
        then MPI_Abort. From the watching thread: the main thread is blocked in a collective."""
        self.report(text)
        if self.on_abort is not None:
            try:
                self.on_abort(text)
            except Exception:                 # the record is a courtesy; ending the job is not
                pass
        time.sleep(0.3)
        MPI.COMM_WORLD.Abort(STALLED_STATUS)

    def _silent(self, progress: np.ndarray, stalled_s: float, beat_seen: np.ndarray) -> dict[int, float]:
        """{rank: seconds since its heartbeat last changed} of the ranks that have stopped beating:
        silent for at least three beats and half the stall (a live rank's thread beats each
        period, the main thread waiting or not). Rank 0 is running this, so it is alive. Judged
        only while rank 0 is at the furthest point (waiting inside MPI): a beat may need rank 0's
        MPI progress to land (MPICH; Open MPI between nodes), which a rank 0 behind in a long
        local phase does not make."""
        if not self.beats or progress[0] != progress.max():
            return {}
        age = time.monotonic() - beat_seen
        bound = max(3 * self.beat_s, stalled_s / 2)
        return {r: float(age[r]) for r in range(1, self.size) if age[r] >= bound}

    def _watch(self, poll_s: float) -> None:
        last, since, reported = self.progress.copy(), time.monotonic(), 0
        beats = self.heartbeats.copy() if self.beats else None
        beat_seen = np.full(self.size, time.monotonic())     # when each rank's heartbeat last changed
        while not self._stop.wait(poll_s):
            if self.beats:
                now_beats = self.heartbeats.copy()
                beat_seen[now_beats != beats] = time.monotonic()
                beats = now_beats
            now = self.progress.copy()
            if not np.array_equal(now, last):
                last, since, reported = now, time.monotonic(), 0
                continue
            stalled = time.monotonic() - since
            names = self.phase_names or self._names_now
            allowance = self._allowance()
            if self.abort_s > 0 and stalled >= self.abort_s * allowance:
                self._end_job(f"{describe_stall(now, names, stalled, self._silent(now, stalled, beat_seen))}; "
                              f"ending the job (status {STALLED_STATUS})")
                return
            if self.timeout_s > 0 and stalled >= self.timeout_s * allowance * (reported + 1):
                self.report(describe_stall(now, names, stalled, self._silent(now, stalled, beat_seen)))
                reported += 1

    def _watch_self(self, poll_s: float) -> None:
        """Ranks other than 0: end the job if this rank has not moved for longer than rank 0's
        watchdog would have allowed (rank 0 is then likely stopped itself)."""
        last, since = int(self._val[0]), time.monotonic()
        while not self._stop.wait(poll_s):
            now = int(self._val[0])
            if now != last:
                last, since = now, time.monotonic()
                continue
            stalled = time.monotonic() - since
            if stalled >= self._backup_bound():
                step, k = divmod(now, SLOTS_PER_STEP)
                where = (f"after '{self._names_now[k - 1]}' of step {step}" if 0 < k <= len(self._names_now)
                         else f"at step {step}")
                self._end_job(f"no progress for {stalled:.0f} s: rank {self.rank} waits {where}, and rank 0's "
                              f"watchdog has not ended the job (rank 0 may be stopped itself); ending the job "
                              f"(status {STALLED_STATUS})")
                return

    def close(self) -> None:
        """Collective: stop the thread and free the window and the communicator; idempotent."""
        self._stop.set()
        for thread in (self._thread, self._beat_thread):
            if thread is not None:
                thread.join()
        self._thread = self._beat_thread = None
        if self.comm == MPI.COMM_NULL:
            return
        self.comm.Barrier()                  # every heartbeat thread has ended before the frees
        for win in (self.win, self.beat_win):
            if win != MPI.WIN_NULL:
                win.Free()
        self.win = self.beat_win = MPI.WIN_NULL
        self.comm.Free()


def start_watchdog(comm: MPI.Comm, timeout_s: float, abort_s: float, stack: contextlib.ExitStack,
                   close_on) -> Watchdog | None:
    """Collective: a :class:`Watchdog` with these bounds (``run.watchdog_s``, ``run.watchdog_abort_s``),
    its ``close`` pushed on ``stack`` through ``close_on`` (the job's exit rule), or None where
    both bounds are 0."""
    if timeout_s <= 0 and abort_s <= 0:
        return None
    watchdog = Watchdog(comm, timeout_s, abort_s=abort_s)
    stack.push(close_on(watchdog.close))
    return watchdog


def busy(watchdog: Watchdog | None, name: str) -> contextlib.AbstractContextManager[None]:
    """``watchdog.busy(name)``: a phase that may be long without step progress (none: nothing)."""
    return watchdog.busy(name) if watchdog is not None else contextlib.nullcontext()
