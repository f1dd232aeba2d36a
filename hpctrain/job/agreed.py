"""Set-up and teardown that every rank reaches together: a phase whose user error, on any rank,
every rank raises (:func:`agreed`), and exit callbacks that run a collective close only when
every rank is on the same exit path (:func:`on_agreed_exit`)."""
from __future__ import annotations

from collections.abc import Callable

from mpi4py import MPI

from hpctrain.errors import UserError
from hpctrain.ops.agree import agree


def on_agreed_exit(close: Callable[[], object]) -> Callable[..., bool]:
    """An ``ExitStack`` exit callback running the collective ``close`` on a normal exit or an
    error every rank raised together (an ``agreed`` :class:`UserError`: set-up errors, stops,
    checkpoint errors, non-finite steps). Any other exception may be this rank's alone: a
    collective would then hang, so it is skipped and the abort hook ends the job."""
    def exit_(exc_type, exc, tb):
        if exc_type is None or (issubclass(exc_type, UserError) and exc_type.agreed):
            close()
        return False
    return exit_


def agreed(comm: MPI.Comm, phase, *args):
    """Run a set-up phase; if it fails on any rank with a :class:`UserError`, every rank raises
    the same one. Any other exception is a bug: it keeps its traceback and aborts the job."""
    error, result = None, None
    try:
        result = phase(*args)
    except UserError as exc:
        error = exc
    agree(comm, error)
    return result
