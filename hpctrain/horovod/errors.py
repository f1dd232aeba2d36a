"""Horovod's exception names, and the one-line errors hpctrain adds to them.

Errors the ranks agree on (a mismatched collective, a bad argument seen by the coordinator) are
raised on every rank involved, as Horovod's are, so a script that catches them goes on. Uncaught,
they end the job in one line through hpctrain's abort hook: only the lowest rank involved speaks
at once; the others wait ``defer_s`` first (the speaker's abort usually ends them before that),
so the line appears once unless the speaker caught its copy.
"""
from __future__ import annotations

from hpctrain.errors import UserError


class HorovodInternalError(RuntimeError):
    """Raised when a collective fails (Horovod's name, so ``except hvd.HorovodInternalError`` works)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic's interrupt; never raised here (elastic training is refused where called)."""


class _Agreed(UserError):
    """Every rank of the collective raises it together; ``defer_s``: how long a rank's abort hook
    waits before it prints (0 for the rank that speaks; set by the coordinator)."""

    defer_s = 0.0


class CollectiveMismatchError(HorovodInternalError, _Agreed):
    """Ranks asked for different collectives (name, shape, dtype, op or root), or asked for one a
    joined rank cannot take part in: Horovod raises a ``RuntimeError`` (its
    ``HorovodInternalError``) on those ranks; so does hpctrain, before any data moves."""


class CollectiveArgumentError(ValueError, _Agreed):
    """An argument that is wrong on some rank (a root outside the process set, alltoall splits
    that do not add up): raised as ``ValueError`` on every rank of the collective."""


class UnsupportedError(UserError, NotImplementedError):
    """A Horovod feature hpctrain refuses; the message names the alternative."""


def unsupported(what: str, instead: str) -> UnsupportedError:
    return UnsupportedError(f"hpctrain.horovod: {what} is not supported; {instead}")
