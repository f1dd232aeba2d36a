"""A rank that fails must fail the job: promptly, non-zero, naming the rank."""
import pytest

from tests.integration.mpirun import mpirun

RAISE_ON_RANK_1 = """
from mpi4py import MPI
from hpctrain.faults import install_abort_hook
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
