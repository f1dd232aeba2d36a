"""The one base of user-facing errors: printed as one line naming the file, field or rank, status 2.

Anything else is a bug: it keeps its traceback and aborts the job (``ops.abort.install_abort_hook``).
``agreed`` says whether every rank raises the error together (set-up errors passed through
``ops.agree.agree``, stop signals, checkpoint errors, non-finite steps): then collective teardown is
safe. An error one rank finds alone (a corrupt shard in its reader) is ``agreed = False``: that
rank prints its line and aborts the job, since the others wait in a collective it will not reach.
"""


class UserError(Exception):
    """A problem with the user's input or environment, not with hpctrain's code."""

    agreed = True


class LocalUserError(UserError):
    """A user-facing error found by one rank alone (see the module docstring)."""

    agreed = False
