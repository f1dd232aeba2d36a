"""Stop signals: SIGTERM/SIGUSR1 (scheduler pre-emption, ``scancel``) and SIGINT (Ctrl-C) set a flag that all ranks
agree on at a step boundary, so the job can checkpoint and stop together (:class:`StopSignal`);
:class:`Stopped` is the error the job raises after that checkpoint.
"""
from __future__ import annotations

import signal
import threading

import numpy as np
from mpi4py import MPI

from hpctrain.errors import UserError


class Stopped(UserError):
    """Training stopped early on a signal, after writing a checkpoint (not a failure of the code)."""


class StopSignal:
    """SIGTERM/SIGUSR1/SIGINT → a flag; every rank learns at the same step that some rank got one.

    The handler only records the signal number (nothing else is safe in a handler). :meth:`poll`,
    called once per step by every rank, completes the previous step's non-blocking MAX-allreduce
    of the flags and starts the next one, so agreement costs no wait and lands one step after the
    signal on all ranks at once. Schedulers send SIGTERM on ``scancel`` (then SIGKILL after
    Slurm's ``KillWait``, 30 s by default) and a chosen signal before the time limit
    (``sbatch --signal=USR1@120``). Ctrl-C at a terminal sends SIGINT to every process of the
    foreground group — the launcher and, unless it moved them, the ranks: the first stops the job
    like SIGTERM; a second on the same rank interrupts it at once (``KeyboardInterrupt``, which
    aborts the job). Uses its own duplicate of ``comm``.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self, comm: MPI.Comm, signals=SIGNALS):
        self.comm = comm.Dup()
        self.local = 0                  # signal number received on this rank (0: none)
        self.agreed = 0                 # max over ranks, known at the same poll on every rank
        self._send, self._recv = np.zeros(1, np.int32), np.zeros(1, np.int32)
        self._req: MPI.Request | None = None
        self._previous: dict = {}
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in signals}

    def _handler(self, signum, frame):
        if signum == signal.SIGINT and self.local == signal.SIGINT:
            raise KeyboardInterrupt                # Ctrl-C twice: stop now, no checkpoint
        self.local = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.agreed).name if self.agreed else ""

    def poll(self) -> bool:
        """Collective, once per step on every rank: True once any rank has received a signal."""
        if self.agreed:
            return True
        if self._req is not None:
            self._req.Wait()
            self._req = None
            self.agreed = int(self._recv[0])
            if self.agreed:
                return True
        self._send[0] = self.local
        self._req = self.comm.Iallreduce(self._send, self._recv, op=MPI.MAX)
        return False

    def close(self) -> None:
        """Complete the request in flight (collective), restore the previous handlers."""
        if self._req is not None:
            self._req.Wait()
            self._req = None
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}
        if self.comm != MPI.COMM_NULL:
            self.comm.Free()
