"""Failure handling: a rank that fails must fail the job, promptly and by name.

* :func:`install_abort_hook` replaces ``sys.excepthook``: an uncaught exception on any rank prints
  ``hpctrain: rank R/N failed: …`` with the traceback and calls ``MPI_Abort``, so ``mpiexec``
  kills every rank and exits non-zero instead of leaving the others blocked in a collective. A
  :class:`~hpctrain.errors.UserError` that reaches it (one rank's alone, e.g. a corrupt shard in
  its reader) prints one line instead, ``hpctrain: error: rank R/N: …``, and aborts with status 2.
* :func:`agree` turns per-rank set-up errors (bad shard file, unimportable model) into the same
  :class:`UserError` on every rank, so the job stops with one clear line and no traceback.
* :func:`check_consistency` compares a fingerprint of the model, config and software on every
  rank at start-up and names the odd rank out (a stale module or config file on one node would
  otherwise surface as a hang or a truncation error inside the first broadcast).
* :class:`StopSignal`: SIGTERM/SIGUSR1 (scheduler pre-emption, ``scancel``) set a flag that all
  ranks agree on at a step boundary, so the job can checkpoint and stop together.
"""
from __future__ import annotations

import hashlib
import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter

import numpy as np
from mpi4py import MPI

from hpctrain.errors import UserError




class ConsistencyError(ValueError):
    """Ranks disagree on model, config or software (same message on every rank; ``agree`` reports it)."""


class AgreedError(ValueError):
    """An error every rank already knows about (the exchange happened): :func:`agree` re-raises it
    as a :class:`UserError` without communicating again."""


class Stopped(UserError):
    """Training stopped early on a signal, after writing a checkpoint (not a failure of the code)."""


def install_abort_hook(comm: MPI.Comm) -> None:
    """Abort the whole job on an uncaught exception in any rank (main or any thread)."""
    rank, size = comm.Get_rank(), comm.Get_size()

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt) and size == 1:
            sys.__excepthook__(exc_type, exc, tb)
            return
        if issubclass(exc_type, UserError):       # the user's problem, found by this rank alone
            status = 2
            text = f"hpctrain: error: rank {rank}/{size}: {exc}\n"
        else:                                     # a bug: keep the traceback
            status = 1
            text = ("".join(traceback.format_exception(exc_type, exc, tb))
                    + f"hpctrain: rank {rank}/{size} failed: {exc_type.__name__}: {exc}\n")
        sys.stderr.write(text + (f"hpctrain: aborting all {size} ranks\n" if size > 1 else ""))
        sys.stderr.flush()
        if size > 1:
            comm.Abort(status)
        os._exit(status)

    sys.excepthook = hook
    threading.excepthook = lambda args: hook(args.exc_type, args.exc_value, args.exc_traceback)


def agree(comm: MPI.Comm, error: BaseException | None) -> None:
    """Collective: if any rank has an error, raise a :class:`UserError` on every rank.

    The message is the failing rank's own line; when ranks fail differently, the first one is
    named (``rank R: …``). Only ``str`` entries count as errors: :func:`check_consistency` sends
    tuples through the same allgather, so a rank that failed early still meets the others.
    """
    if isinstance(error, AgreedError):
        raise UserError(str(error))
    msgs = comm.allgather(None if error is None else str(error))
    bad = [(r, m) for r, m in enumerate(msgs) if isinstance(m, str)]
    if not bad:
        return
    if len({m for _, m in bad}) == 1 and len(bad) == len(msgs):
        raise UserError(bad[0][1])
    r, m = bad[0]
    raise UserError(f"rank {r}: {m}")


# --- start-up consistency -----------------------------------------------------------------------

def model_signature(model) -> list[str]:
    """One line per parameter/buffer: name, shape, dtype (values may differ before the broadcast)."""
    return [f"{name} {tuple(t.shape)} {t.dtype}" for name, t in model.state_dict().items()]


def config_signature(config: dict, software: dict | None = None) -> list[str]:
    """``section.key = value`` lines of a config dict, then the software versions."""
    lines = [f"{sec}.{key} = {value!r}" for sec, table in sorted(config.items())
             for key, value in sorted(table.items())]
    return lines + [f"version {name} = {v}" for name, v in sorted((software or {}).items())]


def software_versions() -> dict:
    import torch

    import hpctrain
    return {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
            "hpctrain": getattr(hpctrain, "__version__", "?"), "mpi": MPI.Get_library_version().split("\n")[0]}


def first_difference(ref: list[str], other: list[str]) -> str:
    """A short description of where two signatures part."""
    for i, (a, b) in enumerate(zip(ref, other)):
        if a != b:
            return f"{b!r} where the reference has {a!r}"
    if len(ref) != len(other):
        longer, n = (ref, len(other)) if len(ref) > len(other) else (other, len(ref))
        side = "missing" if longer is ref else "extra"
        return f"{side} {longer[n]!r} ({len(other)} entries vs {len(ref)})"
    return "same entries"


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def check_consistency(comm: MPI.Comm, model, config: dict, software: dict | None = None) -> None:
    """Collective: every rank must have built the same model from the same config and software.

    Raises the same :class:`ConsistencyError` on every rank naming the odd rank(s) out (the
    minority against the most common fingerprint; on a tie, against rank 0) and the first
    difference; pass it to :func:`agree` like any set-up error. Two 64-byte digests per rank cross
    the network; the full signatures only on a mismatch. Shares ``agree``'s wire format: if another
    rank already failed and is inside ``agree``, this exchange was that ``agree``, and the
    :class:`AgreedError` raised here makes the caller's own ``agree`` re-raise without a collective.
    """
    sigs = {"model": model_signature(model), "config": config_signature(config, software)}
    entries = comm.allgather(("fingerprint", _digest(sigs["model"]), _digest(sigs["config"])))
    for r, e in enumerate(entries):
        if isinstance(e, str):          # that rank failed earlier: this exchange was its agree()
            raise AgreedError(f"rank {r}: {e}")
    problems = []
    for i, what in enumerate(("model", "config")):
        digests = [e[1 + i] for e in entries]
        if len(set(digests)) == 1:
            continue
        counts = Counter(digests)
        best = max(counts.values())
        majority = digests[0] if counts[digests[0]] == best else next(d for d in digests if counts[d] == best)
        ref = digests.index(majority)
        odd = [r for r, d in enumerate(digests) if d != majority]
        mine = sigs[what]
        ref_lines = comm.bcast(mine if comm.Get_rank() == ref else None, root=ref)
        odd_lines = comm.bcast(mine if comm.Get_rank() == odd[0] else None, root=odd[0])
        problems.append(f"the {what} on rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} "
                        f"differs from rank {ref}'s: rank {odd[0]} has {first_difference(ref_lines, odd_lines)}")
    if problems:
        raise ConsistencyError("start-up check failed: " + "; ".join(problems)
                        + " (every rank must run the same code, config file and software)")


# --- stop signals ---------------------------------------------------------------------------------

class StopSignal:
    """SIGTERM/SIGUSR1 → a flag; every rank learns at the same step that some rank got one.

    The handler only records the signal number (nothing else is safe in a handler). :meth:`poll`,
    called once per step by every rank, completes the previous step's non-blocking MAX-allreduce
    of the flags and starts the next one, so agreement costs no wait and lands one step after the
    signal on all ranks at once. Schedulers send SIGTERM on ``scancel`` (then SIGKILL after
    Slurm's ``KillWait``, 30 s by default) and a chosen signal before the time limit
    (``sbatch --signal=USR1@120``). Uses its own duplicate of ``comm``.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, comm: MPI.Comm, signals=SIGNALS):
        self.comm = comm.Dup()
        self.local = 0                  # signal number received on this rank (0: none)
        self.agreed = 0                 # max over ranks, known at the same poll on every rank
        self._send, self._recv = np.zeros(1, np.int32), np.zeros(1, np.int32)
        self._req = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handler) for s in signals}

    def _handler(self, signum, frame):
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


# --- test hooks -------------------------------------------------------------------------------------

def maybe_inject(rank: int, step: int) -> None:
    """Test hook: ``HPCTRAIN_INJECT_FAULT=RANK:STEP`` raises on that rank at that step;
    ``RANK:STEP:sleep=SECONDS`` stalls it instead (for the watchdog)."""
    spec = os.environ.get("HPCTRAIN_INJECT_FAULT")
    if spec:
        r, _, rest = spec.partition(":")
        s, _, action = rest.partition(":")
        if int(r) == rank and int(s or 0) == step:
            if action.startswith("sleep="):
                time.sleep(float(action[len("sleep="):]))
                return
            raise RuntimeError(f"injected fault (HPCTRAIN_INJECT_FAULT={spec})")


_kill_counts: Counter = Counter()


def maybe_kill(where: str) -> None:
    """Test hook: ``HPCTRAIN_INJECT_KILL=WHERE:N`` SIGKILLs this process the N-th time it passes
    ``where`` (e.g. ``checkpoint:2``: half-way through writing the second checkpoint)."""
    spec = os.environ.get("HPCTRAIN_INJECT_KILL")
    if not spec:
        return
    name, _, n = spec.partition(":")
    if name == where:
        _kill_counts[where] += 1
        if _kill_counts[where] == int(n or 1):
            os.kill(os.getpid(), signal.SIGKILL)
