"""The one base of user-facing errors: printed as one line naming the file, field or rank, status 2
(a training collapse, :class:`TrainingCollapsed`: status 6).

Anything else is a bug: it keeps its traceback and aborts the job (``ops.abort.install_abort_hook``).
``agreed`` says whether every rank raises the error together (set-up errors passed through
``ops.agree.agree``, stop signals, checkpoint errors, non-finite steps): then collective teardown is
safe. An error one rank finds alone (a corrupt shard in its reader) is ``agreed = False``: that
rank prints its line and aborts the job, since the others wait in a collective it will not reach.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator


class UserError(Exception):
    """A problem with the user's input or environment, not with hpctrain's code."""

    agreed = True


class ConfigError(UserError, ValueError):
    """A configuration value is wrong; the message names the field (``section.key``)."""


class MissingPackageError(UserError, ImportError):
    """An optional package is not installed; the message says what to install."""


class LocalUserError(UserError):
    """A user-facing error found by one rank alone (see the module docstring)."""

    agreed = False


class TrainingCollapsed(UserError):
    """The training loss went back to the chance level and stayed there, or never left it by the end
    of the run (:mod:`hpctrain.ops.collapse`): every rank raises it at the same step; exit status 6,
    ``collapsed`` in ``hpctrain status``."""

    exit_status = 6
    run_state = "collapsed"


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """Inside, a ``ValueError`` from a builder's argument checks becomes a :class:`ConfigError`
    with the same message: the arguments were read from a config section (``*_from_config``)."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
