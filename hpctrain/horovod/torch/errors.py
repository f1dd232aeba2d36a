"""Horovod's exception names, and the one-line errors hpctrain adds to them."""
from __future__ import annotations

from hpctrain.errors import UserError


class HorovodInternalError(RuntimeError):
    """Raised when a collective fails (Horovod's name, so ``except hvd.HorovodInternalError`` works)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod elastic's interrupt; never raised here (elastic training is refused at ``init``)."""


class CollectiveMismatchError(HorovodInternalError, UserError):
    """Ranks asked for different collectives (name, shape, dtype, op or root), or one rank did
    not arrive within the stall window: a :class:`~hpctrain.errors.UserError`, so the abort hook
    prints its one line and ends the job with status 2 instead of hanging or summing garbage."""


class UnsupportedError(UserError, NotImplementedError):
    """A Horovod feature hpctrain refuses; the message names the alternative."""


def unsupported(what: str, instead: str) -> UnsupportedError:
    return UnsupportedError(f"hpctrain.horovod: {what} is not supported; {instead}")
