"""Failure handling: a rank that fails must fail the job, promptly and by name.

* :func:`install_abort_hook` replaces ``sys.excepthook``: an uncaught exception on any rank prints
  ``hpctrain: rank R/N failed: …`` with the traceback and calls ``MPI_Abort``, so ``mpiexec``
  kills every rank and exits non-zero instead of leaving the others blocked in a collective.
* :func:`agree` turns per-rank set-up errors (bad shard file, unimportable model) into the same
  :class:`UserError` on every rank, so the job stops with one clear line and no traceback.
"""
from __future__ import annotations

import os
import sys
import threading
import traceback

from mpi4py import MPI


class UserError(Exception):
    """A problem with the user's input; printed as one line, exit status 2."""


def install_abort_hook(comm: MPI.Comm) -> None:
    """Abort the whole job on an uncaught exception in any rank (main or any thread)."""
    rank, size = comm.Get_rank(), comm.Get_size()

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt) and size == 1:
            sys.__excepthook__(exc_type, exc, tb)
            return
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"{text}hpctrain: rank {rank}/{size} failed: {exc_type.__name__}: {exc}\n"
                         f"hpctrain: aborting all {size} ranks\n")
        sys.stderr.flush()
        if size > 1:
            comm.Abort(1)
        os._exit(1)

    sys.excepthook = hook
    threading.excepthook = lambda args: hook(args.exc_type, args.exc_value, args.exc_traceback)


def agree(comm: MPI.Comm, error: BaseException | None) -> None:
    """Collective: if any rank has an error, raise a :class:`UserError` on every rank.

    The message is the failing rank's own line; when ranks fail differently, the first one is
    named (``rank R: …``).
    """
    msgs = comm.allgather(None if error is None else str(error))
    bad = [(r, m) for r, m in enumerate(msgs) if m is not None]
    if not bad:
        return
    if len({m for _, m in bad}) == 1 and len(bad) == len(msgs):
        raise UserError(bad[0][1])
    r, m = bad[0]
    raise UserError(f"rank {r}: {m}")


def maybe_inject(rank: int, step: int) -> None:
    """Test hook: ``HPCTRAIN_INJECT_FAULT=RANK:STEP`` raises on that rank at that step."""
    spec = os.environ.get("HPCTRAIN_INJECT_FAULT")
    if spec:
        r, _, s = spec.partition(":")
        if int(r) == rank and int(s or 0) == step:
            raise RuntimeError(f"injected fault (HPCTRAIN_INJECT_FAULT={spec})")
