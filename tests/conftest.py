"""Test-suite wiring shared by serial and MPI runs.

Under ``mpiexec … pytest --only-mpi`` each rank runs the whole session and pytest-mpi lets rank 0's
exit code hide a failure on another rank; :func:`pytest_sessionfinish` gathers every rank's failure
count so all ranks exit non-zero when any failed. A rank's failure is printed the moment it happens
(:func:`pytest_runtest_logreport`), each line prefixed ``[rank R]``: when the other ranks then hang
in a collective until the timeout ends the job, the cause is already on the screen. Resources a
test opens go through the :func:`closer` fixture, so they are freed in teardown even when an
assertion fails (a leaked communicator or window would otherwise change later tests).
"""
import contextlib
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def _world():
    if "--only-mpi" not in os.environ.get("PYTEST_ADDOPTS", "") and not _mpi_run():
        return None
    from mpi4py import MPI
    return MPI.COMM_WORLD


def _mpi_run() -> bool:
    return any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def pytest_configure(config):
    comm = _world()
    if comm is not None and comm.Get_rank() > 0:
        config.option.verbose = -1   # one summary per rank, but keep other ranks terse


def pytest_runtest_logreport(report):
    if not report.failed:
        return
    comm = _world()
    if comm is None or comm.Get_size() == 1:
        return
    rank = comm.Get_rank()
    text = f"{report.nodeid} FAILED in {report.when}\n{report.longreprtext}"
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
    sys.stderr.flush()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    comm = _world()
    if comm is None or comm.Get_size() == 1:
        return
    failed = comm.allgather(int(session.testsfailed or exitstatus not in (0, 5)))
    if any(failed):
        bad = [r for r, f in enumerate(failed) if f]
        if comm.Get_rank() == 0:
            print(f"\nMPI test run failed on rank(s) {bad}")
        session.exitstatus = 1


@pytest.hookimpl(tryfirst=True)      # before xdist reads the groups (its own hook, same name)
def pytest_collection_modifyitems(config, items):
    """The serial suite runs on two pytest-xdist workers with ``--dist loadgroup``: a test goes to
    whichever worker is free, except that the tests of a module sharing a module- or class-scoped
    fixture (one finished run several tests inspect, a converted dataset) form one group, so the
    fixture is made once, on one worker, instead of once on each."""
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        scopes = {d.scope for fds in (defs.name2fixturedefs.values() if defs else ()) for d in fds}
        if scopes & {"module", "class"}:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture
def closer():
    """``closer(obj)`` returns ``obj`` and calls ``obj.close()`` in teardown, newest first.

    Teardown runs whether or not the test's assertions passed, on every rank, so collective
    ``close`` methods (communicators, windows, ``mpio`` files) stay matched across ranks.
    """
    with contextlib.ExitStack() as stack:
        def register(obj):
            stack.callback(obj.close)
            return obj
        yield register


@pytest.fixture
def plugin_sandbox(monkeypatch):
    """Undo in teardown what a test's imports of example plugins (``examples.plugins``) register,
    and forget those modules, so later tests see the built-in names only (``bf16`` is an unknown
    codec in tests/unit/test_comm_parts.py) and a later import registers afresh."""
    from hpctrain.data_tools.sources import SOURCES
    from hpctrain.comm import COMPRESSIONS, STRATEGIES
    from hpctrain.optim import OPTIMIZERS
    from hpctrain.update import ALGORITHMS
    for reg in (STRATEGIES, COMPRESSIONS, ALGORITHMS, OPTIMIZERS, SOURCES):
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    yield
    for name in [m for m in sys.modules if m.startswith("examples.plugins.")]:
        del sys.modules[name]


@pytest.fixture
def world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """The digits dataset converted once per session (rank 0 converts into a shared path)."""
    from mpi4py import MPI

    from hpctrain.data_tools.builtin import resolve_dataset
    comm = MPI.COMM_WORLD
    base = os.environ.get("HPCTRAIN_TEST_CACHE") or os.path.expanduser("~/.cache/hpctrain")
    return resolve_dataset("digits", base, comm)
