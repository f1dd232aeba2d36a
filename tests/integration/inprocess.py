"""Call the CLI's entry (``hpctrain.cli.main``) in the pytest process, one rank, no launcher.

A start-up refusal (a bad config value, a missing or corrupt file, a checkpoint of another run)
is decided before any training step, by code that runs the same on one rank as on many; seeing it
needs no ``mpiexec`` (each launch costs ~8 s of wall and 13 s of CPU, mostly imports). One real
launch per refusal kind stays in the suite to prove the status reaches the launcher.

What the job changes in the process is put back: ``sys.excepthook`` and ``threading.excepthook``
(the abort hook), the working directory, ``sys.path`` and the modules a plugin import added. MPI
stays initialised as a singleton, as in the unit tests that touch ``MPI.COMM_WORLD``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading


def run_cli(capsys, *argv: str, cwd=None, path=None) -> subprocess.CompletedProcess:
    """``python -m hpctrain ARGV`` in process: its status and what it printed, as
    :func:`subprocess.run` returns them (``returncode``, ``stdout``, ``stderr``). ``path`` goes in
    front of ``sys.path`` (the launch's ``PYTHONPATH``), ``cwd`` is the working directory."""
    from hpctrain.cli import main
    saved = (sys.excepthook, threading.excepthook, os.getcwd(), list(sys.path), set(sys.modules))
    capsys.readouterr()                         # what the test printed before is not the job's
    try:
        if path is not None:
            sys.path.insert(0, str(path))
        if cwd is not None:
            os.chdir(cwd)
        try:
            status = main(list(argv))
        except SystemExit as exc:               # argparse's own refusals
            status = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.excepthook, threading.excepthook = saved[0], saved[1]
        os.chdir(saved[2])
        sys.path[:] = saved[3]
        homes = tuple(os.path.realpath(str(d)) + os.sep for d in (path, cwd) if d is not None)
        for name in set(sys.modules) - saved[4]:        # a user's module imported from there: forgotten
            where = getattr(sys.modules[name], "__file__", None) or ""
            if homes and os.path.realpath(where).startswith(homes):
                del sys.modules[name]
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["hpctrain", *argv], status, out, err)
