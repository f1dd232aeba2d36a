"""A job's run directory from start to end: held, identified, and left saying how the run ended.

:class:`RunDirectory` is the job's first and last context: on entry rank 0 locks the run
directory (and a checkpoint directory of its own, :func:`~hpctrain.ops.runlock.hold_run_dirs`)
and records ``running`` in ``state.json``; any exception but a stop leaving the block records
``failed`` with its line; the job records ``done``, ``stopped`` or (through the watchdog)
``stalled`` with their details (:mod:`hpctrain.ops.runstate`, read by ``hpctrain status``).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from mpi4py import MPI

from hpctrain.ops import runstate
from hpctrain.ops.fileio import WriteError
from hpctrain.ops.rundircheck import RunDirError, run_dir_problem
from hpctrain.ops.runlock import hold_run_dirs, run_identity


class RunDirectory:
    """Collective context manager over ``comm``: the run directory is this job's inside it."""

    def __init__(self, comm: MPI.Comm, run_dir: str, ckpt_dir: str | None = None):
        self.comm, self.run_dir, self.ckpt_dir = comm, run_dir, ckpt_dir
        self.rank0 = comm.Get_rank() == 0
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> RunDirectory:
        with contextlib.ExitStack() as stack:
            stack.enter_context(hold_run_dirs(self.comm, [self.run_dir] + ([self.ckpt_dir] if self.ckpt_dir else [])))
            problem = run_dir_problem(self.run_dir, self.ckpt_dir or os.path.join(self.run_dir, "checkpoints")) \
                if self.rank0 else None
            if self.rank0 and not problem:          # how it ends: `hpctrain status RUN_DIR`
                try:
                    runstate.record(self.run_dir, "running")
                except WriteError as exc:
                    problem = str(exc)
            problem = self.comm.bcast(problem, root=0)     # before anything else is written, on every rank
            if problem:
                raise RunDirError(problem)
            stack.push(runstate.record_exit(self.run_dir, self.rank0))
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> bool | None:
        return self._stack.__exit__(*exc)

    def identity(self, comm: MPI.Comm, fresh: bool) -> str:
        """Collective: the run's id (:func:`~hpctrain.ops.runlock.run_identity`)."""
        return run_identity(comm, self.run_dir, fresh)

    def record(self, state: str, **fields) -> None:
        """Rank 0 records the run's state (``done``, ``stopped``)."""
        if self.rank0:
            runstate.record(self.run_dir, state, **fields)

    def on_stall(self, log, step: Callable[[], int]) -> Callable[[str], None]:
        """The watchdog's ``on_abort``: the job is being ended; ``step()`` says where it was."""
        rank = self.comm.Get_rank()

        def record(text: str) -> None:
            # rank 0; rank 1 when rank 0 is the stalled one and rank 1's own watch ends the job
            if rank in (0, 1):
                with contextlib.suppress(WriteError):      # the job is ending with its own line
                    runstate.record(self.run_dir, "stalled", message=text, step=step())
            log.log("stalled", message=text, step=step())         # metrics.jsonl: rank 0's log
        return record
