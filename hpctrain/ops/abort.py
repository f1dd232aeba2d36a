"""A rank that fails must fail the job, promptly and by name.

:func:`install_abort_hook` replaces ``sys.excepthook``: an uncaught exception on any rank prints
``hpctrain: rank R/N failed: …`` with the traceback and calls ``MPI_Abort``, so ``mpiexec`` kills
every rank and exits non-zero instead of leaving the others blocked in a collective. A
:class:`~hpctrain.errors.UserError` that reaches it (one rank's alone, e.g. a corrupt shard in its
reader) prints one line instead, ``hpctrain: error: rank R/N: …``, and aborts with status 2. An
error every rank raises together (``hpctrain.horovod``'s agreed errors) carries ``defer_s``: the
ranks that are not to speak wait that long first, so the job ends with one rank's line.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback

from mpi4py import MPI

from hpctrain.errors import UserError

LOCAL_STAGGER_S = 1.0       # per rank, up to rank 4: a user error's line comes from the lowest failing rank


def install_abort_hook(comm: MPI.Comm) -> None:
    """Abort the whole job on an uncaught exception in any rank (main or any thread).

    ``comm`` names the rank in the message (it may be a duplicate, e.g. ``hvd.init(comm=...)``);
    the abort always goes to ``MPI.COMM_WORLD``.
    """
    rank, size = comm.Get_rank(), comm.Get_size()

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt) and size == 1:
            sys.__excepthook__(exc_type, exc, tb)
            return
        defer_s = getattr(exc, "defer_s", 0.0)
        if defer_s and size > 1:    # raised on every rank together: let the speaking rank's line win
            time.sleep(defer_s)
        elif issubclass(exc_type, UserError) and size > 1:
            with contextlib.suppress(ValueError):        # not the main thread: keep the handler
                # this rank is ending: the launcher's SIGTERM after another rank's abort (Open MPI's) must
                # end it here, not reach the stop-signal handler and leave it time to print its own line
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            time.sleep(min(rank, 4) * LOCAL_STAGGER_S)
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
            time.sleep(0.3)       # let the launcher forward the line first (MPICH's Hydra lost it 1 in 6)
            MPI.COMM_WORLD.Abort(status)   # the world's: MPICH ends only the caller on a duplicate
        os._exit(status)

    sys.excepthook = hook
    threading.excepthook = lambda args: hook(args.exc_type, args.exc_value, args.exc_traceback)
