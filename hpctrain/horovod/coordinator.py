"""Agreement before every ad-hoc collective: a mismatch raises on every rank, never a hang.

Horovod's coordinator (rank 0 of its background thread) collects what each rank is ready to
reduce and answers with what to run, so ranks that ask for different tensors get an error instead
of a deadlock or a wrong sum. hpctrain has no background thread; the same agreement happens when a
collective is *submitted*: each rank sends rank 0 a :class:`Sig` (kind, name, dtype, shape, op,
root, and any problem it found with its own arguments), rank 0 compares them (:func:`judge`, a
pure function) and answers every rank with a verdict. Since submission blocks until the verdict,
every rank then posts its MPI collectives in the same order, so non-blocking collectives never
cross. A verdict with an error is raised on every active rank (:class:`CollectiveMismatchError`,
a ``RuntimeError`` as Horovod's; :class:`CollectiveArgumentError`, a ``ValueError``) before any
data moves, so a script that catches it can go on with the next collective.

What rank 0 sees also gives two Horovod behaviours for free:

* **Stalls.** A rank that does not submit within ``HOROVOD_STALL_CHECK_TIME_SECONDS`` (60) is
  named in a warning; past ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (hpctrain's default 600; 0:
  never) the job ends with one line naming the missing ranks and status 2 (the missing rank
  cannot be told to raise).
* **join.** A rank that called ``join()`` submits ``join`` instead; rank 0 tells it which
  collective the others run, and it takes part with a neutral contribution (zeros for sums).
  When every rank has joined, each gets the last rank to join.
* **A named async call the others never make.** Where some ranks submit a named
  ``allreduce_async`` (``Sig.parkable``) and the rest a ``barrier``, Horovod's background thread
  leaves the allreduce pending and runs the barrier. So does rank 0 here: the allreduce's ranks
  are answered "parked" (their handle never completes) and the barrier's ranks keep waiting
  until those ranks reach the barrier too. Any other difference stays a mismatch.

Cost: two small messages per rank per collective through rank 0 (measured in docs/horovod.md);
the gradient path of ``DistributedOptimizer`` agrees once per step, not per tensor.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

from mpi4py import MPI

from hpctrain.horovod.errors import CollectiveArgumentError, CollectiveMismatchError

TAG_SIG, TAG_VERDICT = 7301, 7302
GRACE_S = 15.0          # non-coordinators wait this much longer, so rank 0's line is the one shown


class Sig(NamedTuple):
    """What a rank is about to call. ``shape`` holds what must match (``*`` where a dimension may
    differ); ``extra`` is this rank's own part (allgather rows, alltoall splits) and ``problem``
    what is wrong with this rank's own arguments (empty: nothing); neither is compared."""
    kind: str
    name: str
    dtype: str = ""
    shape: tuple = ()
    op: str = ""
    root: int = -1
    extra: object = None
    problem: str = ""
    parkable: bool = False      # a user-named *_async call: may stay pending while the others barrier

    def describe(self) -> str:
        parts = [self.kind, repr(self.name)]
        if self.dtype:
            parts.append(self.dtype)
        if self.shape:
            parts.append("[" + ", ".join(str(d) for d in self.shape) + "]")
        if self.op:
            parts.append(f"op={self.op}")
        if self.root >= 0:
            parts.append(f"root={self.root}")
        return " ".join(parts)

    def key(self) -> tuple:
        return self[:6]


class Verdict(NamedTuple):
    """Rank 0's answer: ``error`` (one line) or the collective to run (``sig``: what the active
    ranks submitted, for joined ranks to mirror), the joined ranks, every rank's ``extra``
    where the collective needs it, and ``last_joined`` once every rank has joined. An error
    verdict also carries the active ranks' ``names``: they counted their automatic names, and a
    joined rank's counter must follow."""
    error: str | None = None
    sig: Sig | None = None
    error_kind: str = "mismatch"        # or "argument" (a ValueError)
    joined: tuple = ()
    extras: tuple = ()
    last_joined: int = -1
    names: tuple = ()
    parked: tuple = ()          # ranks whose (parkable) call is left pending; the others wait on


def _ranks(rs) -> str:
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))


def judge(sigs: list[Sig], refuse_joined: Callable[[Sig, tuple], str | None] = lambda s, j: None) -> Verdict:
    """Rank 0's comparison of every rank's :class:`Sig` (index = rank). Pure: unit-tested alone."""
    joined = tuple(r for r, s in enumerate(sigs) if s.kind == "join")
    active = [(r, s) for r, s in enumerate(sigs) if s.kind != "join"]
    if not active:
        return Verdict(joined=joined)
    # A rank's own argument problem first: it often also makes the calls differ (a 0-d tensor
    # where the others pass 1-d), and it is the cause to report (ValueError, as Horovod's).
    names = tuple(s.name for _, s in active) if joined else ()
    bad = [(r, s) for r, s in active if s.problem]
    if bad:
        rs = [r for r, s in bad if s.problem == bad[0][1].problem]
        return Verdict(error=f"hpctrain.horovod: {bad[0][1].describe()}: {bad[0][1].problem} "
                             f"(on {_ranks(rs)})", joined=joined, error_kind="argument", names=names)
    groups: dict[tuple, list[int]] = {}
    for r, s in active:
        groups.setdefault(s.key(), []).append(r)
    parked = _parked(active)
    if parked:
        return Verdict(parked=parked)
    if len(groups) > 1:
        by_rank = {r: s for r, s in active}
        what = "; ".join(f"{_ranks(rs)}: {by_rank[rs[0]].describe()}" for rs in groups.values())
        return Verdict(error=f"hpctrain.horovod: ranks called different collectives ({what}); "
                             "every rank must make the same calls in the same order", joined=joined,
                       names=names)
    sig = active[0][1]
    if joined:
        why = refuse_joined(sig, joined)
        if why:
            return Verdict(error=f"hpctrain.horovod: {sig.describe()} while {_ranks(joined)} "
                                 f"joined: {why}", sig=sig, joined=joined)
    extras = tuple(s.extra for s in sigs) if sig.extra is not None else ()
    return Verdict(sig=sig, joined=joined, extras=extras)


def _parked(active: list[tuple[int, Sig]]) -> tuple:
    """The ranks whose named async call is left pending (Horovod's behaviour) because every other
    active rank submitted a ``barrier``; () where that is not the case."""
    kinds = {s.kind for _, s in active}
    parked = tuple(r for r, s in active if s.parkable)
    if "barrier" not in kinds or not parked:
        return ()
    if all(s.parkable or s.kind == "barrier" for _, s in active):
        return parked
    return ()


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        raise ValueError(f"{name}: expected seconds, got {raw!r}") from None


class Coordinator:
    """Rank 0 agrees every collective with every rank over its own duplicate of ``comm``."""

    def __init__(self, comm: MPI.Comm, refuse_joined: Callable[[Sig, tuple], str | None] = lambda s, j: None):
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.warn_s = _env_seconds("HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0)
        self.abort_s = _env_seconds("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 600.0)
        self.refuse_joined = refuse_joined
        # The whole job ends: MPICH's Abort on any other communicator (even a Dup of the world)
        # ends only the calling process, leaving a rank that never came running.
        self._abort = MPI.COMM_WORLD.Abort
        self._join_order: list[int] = []     # rank 0: ranks in the order they joined
        self._carried: list[Sig | None] = [None] * self.size    # rank 0: sigs received, not yet judged
        self.n_agreed = 0

    def agree(self, sig: Sig) -> Verdict:
        """Block until rank 0 has compared ``sig`` with every rank's; raise the verdict's error on
        every active rank (a joined rank gets the verdict and goes on waiting)."""
        self.n_agreed += 1
        if self.size == 1:          # nothing to compare: only an argument problem to raise
            if not sig.problem:
                return Verdict(sig=sig, extras=(sig.extra,) if sig.extra is not None else (),
                               last_joined=0 if sig.kind == "join" else -1)
            verdict = judge([sig], self.refuse_joined)
        else:
            verdict = self._coordinate(sig) if self.rank == 0 else self._ask(sig)
        if self.rank in verdict.parked:
            return verdict
        if verdict.error and sig.kind != "join":
            speaker = min(r for r in range(self.size) if r not in verdict.joined)
            cls = CollectiveArgumentError if verdict.error_kind == "argument" else CollectiveMismatchError
            exc = cls(verdict.error)
            exc.defer_s = 0.0 if self.rank == speaker else 2.0
            raise exc
        return verdict

    # --- rank 0 -------------------------------------------------------------------------------
    def _coordinate(self, mine: Sig) -> Verdict:
        """Collect every rank's sig (some may have come during rank 0's previous call), judge,
        answer. Ranks whose call is parked are answered at once and asked again: their next
        call is what the others wait for."""
        sigs: list[Sig | None] = [mine, *self._carried[1:]]
        self._carried = [None] * self.size
        while True:
            verdict = self._judge_all(sigs)
            if not verdict.parked:
                break
            for r in verdict.parked:
                if r != 0:
                    self.comm.send(verdict, dest=r, tag=TAG_VERDICT)
                sigs[r] = None
            if 0 in verdict.parked:             # the others' sigs wait for rank 0's next call
                self._carried = sigs
                return verdict
        for r in range(1, self.size):
            self.comm.send(verdict, dest=r, tag=TAG_VERDICT)
        return verdict

    def _judge_all(self, sigs: list[Sig | None]) -> Verdict:
        """Wait for the sigs still missing (stall warning and shutdown), then :func:`judge`."""
        mine = sigs[0]
        assert mine is not None
        t0, warned = time.monotonic(), False
        missing = sum(s is None for s in sigs)
        pause = _Backoff()
        while missing:
            status = MPI.Status()
            if self.comm.iprobe(MPI.ANY_SOURCE, TAG_SIG, status):
                r = status.Get_source()
                sigs[r] = self.comm.recv(source=r, tag=TAG_SIG)
                missing -= 1
                continue
            waited = time.monotonic() - t0
            late = [r for r, s in enumerate(sigs) if s is None]
            if not warned and waited > self.warn_s:
                warned = True
                sys.stderr.write(f"hpctrain.horovod: warning: {_ranks(late)} not at {mine.describe()} "
                                 f"after {waited:.0f} s (the others wait there)\n")
                sys.stderr.flush()
            if self.abort_s > 0 and waited > self.abort_s:
                error = (f"hpctrain.horovod: {_ranks(late)} did not reach {mine.describe()} within "
                         f"{self.abort_s:.0f} s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS); ending the job")
                self._fail(error, speak=True)
            pause()
        got = [s for s in sigs if s is not None]
        assert len(got) == self.size            # none missing
        for r, s in enumerate(got):
            if s.kind == "join" and r not in self._join_order:
                self._join_order.append(r)
        verdict = judge(got, self.refuse_joined)
        if verdict.error is None and not verdict.parked and len(verdict.joined) == self.size:
            verdict = verdict._replace(last_joined=self._join_order[-1])
            self._join_order = []
        return verdict

    # --- every other rank ---------------------------------------------------------------------
    def _ask(self, sig: Sig) -> Verdict:
        self.comm.send(sig, dest=0, tag=TAG_SIG)
        t0, warned, pause = time.monotonic(), False, _Backoff()
        while not self.comm.iprobe(0, TAG_VERDICT):
            waited = time.monotonic() - t0
            if not warned and waited > self.warn_s + GRACE_S and self.rank == 1:
                warned = True
                sys.stderr.write(f"hpctrain.horovod: warning: rank 0 has not answered {sig.describe()} "
                                 f"after {waited:.0f} s\n")
                sys.stderr.flush()
            if self.abort_s > 0 and waited > self.abort_s + GRACE_S:
                self._fail(f"hpctrain.horovod: rank 0 did not reach {sig.describe()} within "
                           f"{self.abort_s:.0f} s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS); ending the job",
                           speak=self.rank == 1)
            pause()
        return self.comm.recv(source=0, tag=TAG_VERDICT)

    def _fail(self, line: str, speak: bool) -> None:
        """One line from one rank, then the whole job ends with status 2 (a user error)."""
        if speak:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        time.sleep(0.3 if speak else 2.0)     # the speaker's line first; its abort usually wins
        self._abort(2)

    def close(self) -> None:
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()


class _Backoff:
    """How a rank waits for the others: spin (a collective's partners usually arrive within
    microseconds), then yield the core between probes, then sleep with a doubling pause (a rank
    that waits long must not steal an oversubscribed core). Measured in docs/horovod.md."""

    SPIN_S, YIELD_S, MAX_SLEEP_S = 2e-4, 5e-3, 1e-3

    def __init__(self):
        self.t0, self.sleep = time.perf_counter(), 5e-5

    def __call__(self) -> None:
        waited = time.perf_counter() - self.t0
        if waited < self.SPIN_S:
            return
        if waited < self.YIELD_S:
            os.sched_yield()
            return
        time.sleep(self.sleep)
        self.sleep = min(self.MAX_SLEEP_S, 2 * self.sleep)
