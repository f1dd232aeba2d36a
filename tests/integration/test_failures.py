"""A rank that fails must fail the job: promptly, non-zero, naming the rank.

"Promptly" is a wall-time bound: the file runs alone (marker ``alone``), after the parallel part."""
import os
import signal
import time

import pytest

from tests.integration.mpirun import IMPL, MPIEXEC, mpirun, rank_pids, start_training

pytestmark = pytest.mark.alone

RAISE_ON_RANK_1 = """
from mpi4py import MPI
from hpctrain.ops.abort import install_abort_hook
comm = MPI.COMM_WORLD
install_abort_hook(comm)
if comm.Get_rank() == 1:
    raise RuntimeError("boom on purpose")
comm.Barrier()          # the other ranks block here; the abort must free them
"""


def test_exception_on_one_rank_aborts_all():
    r, secs = mpirun(2, ["-c", RAISE_ON_RANK_1], timeout=60)
    assert r.returncode != 0
    assert secs < 30
    assert "rank 1/2 failed: RuntimeError: boom on purpose" in r.stderr


def test_training_fault_mid_run_names_rank(tmp_path):
    r, secs = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path), "--no-progress", "--epochs", "3"],
                     env={"HPCTRAIN_INJECT_FAULT": "1:5"}, timeout=120)
    assert r.returncode != 0, r.stdout
    assert secs < 60
    assert "rank 1/2 failed" in r.stderr and "injected fault" in r.stderr


def test_exception_on_rank_2_of_4_stops_all_and_names_it(tmp_path):
    r, secs = mpirun(4, ["-m", "hpctrain", "--run-dir", str(tmp_path), "--no-progress", "--epochs", "3"],
                     env={"HPCTRAIN_INJECT_FAULT": "2:5"}, timeout=120)
    assert r.returncode != 0, r.stdout
    assert "hpctrain: rank 2/4 failed: RuntimeError: injected fault" in r.stderr
    assert "aborting all 4 ranks" in r.stderr
    assert not any(f"rank {k}/4 failed" in r.stderr for k in (0, 1, 3))
    assert secs < 90


def test_kill_9_of_one_rank_fails_the_job_promptly(tmp_path):
    """SIGKILL one of 4 ranks mid-training: the launcher must return non-zero within 30 s."""
    proc = start_training(tmp_path, 4, "--epochs", "50")
    try:
        victims = rank_pids(proc.pid)
        assert len(victims) == 4, victims
        os.kill(victims[2], signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        secs = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert secs < 30, f"{MPIEXEC} took {secs:.1f} s to notice"
    print(f"{MPIEXEC} exited {proc.returncode} {secs:.2f} s after SIGKILL of rank 2/4")
    if IMPL == "openmpi":
        assert "signal 9" in err or "Killed" in err
