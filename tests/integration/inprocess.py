"""Call a command's entry (``hpctrain.cli.main``, ``hpctrain.data_tools.cli.main``) in the pytest
process, one rank, no launcher.

A start-up refusal (a bad config value, a missing or corrupt file, a checkpoint of another run)
is decided before any training step, by code that runs the same on one rank as on many; seeing it
needs no ``mpiexec`` (each launch costs ~8 s of wall and 13 s of CPU, mostly imports). One real
launch per refusal kind stays in the suite to prove the status reaches the launcher. The same
holds for a one-rank job or a dataset conversion that a test only needs done: a new process
would import torch and ``torch._dynamo`` again (about 3.5 s of CPU) to run the same code.

What the job changes in the process is put back: ``sys.excepthook`` and ``threading.excepthook``
(the abort hook), the working directory, ``sys.path``, the modules a plugin import added, torch's
thread count and the torch, NumPy and ``random`` generators' states (a job seeds them). MPI stays
initialised as a singleton, as in the unit tests that touch ``MPI.COMM_WORLD``.
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
    return _run(capsys, main, "hpctrain", argv, cwd, path)


def run_data_tools(capsys, *argv: str, cwd=None) -> subprocess.CompletedProcess:
    """``python -m hpctrain.data_tools ARGV`` in process, as :func:`run_cli`."""
    from hpctrain.data_tools.cli import main
    return _run(capsys, main, "hpctrain.data_tools", argv, cwd, None)


def _run(capsys, main, prog: str, argv, cwd, path) -> subprocess.CompletedProcess:
    import random

    import numpy as np
    import torch
    saved = (sys.excepthook, threading.excepthook, os.getcwd(), list(sys.path), set(sys.modules))
    kept = (torch.get_num_threads(), torch.random.get_rng_state(), np.random.get_state(), random.getstate())
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
        torch.set_num_threads(kept[0])
        torch.random.set_rng_state(kept[1])
        np.random.set_state(kept[2])
        random.setstate(kept[3])
        os.chdir(saved[2])
        sys.path[:] = saved[3]
        homes = tuple(os.path.realpath(str(d)) + os.sep for d in (path, cwd) if d is not None)
        for name in set(sys.modules) - saved[4]:        # a user's module imported from there: forgotten
            where = getattr(sys.modules[name], "__file__", None) or ""
            if homes and os.path.realpath(where).startswith(homes):
                del sys.modules[name]
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess([prog, *argv], status, out, err)
