"""The batch scripts under HPCTRAIN_MPI=mpich: Hydra's flags, the MPICH venv, staging by mpiexec."""
import subprocess

import pytest

from tests.unit.test_jobs import ROOT, clean_env, dry_run

SHAPE = ("--nodes", "4", "--ranks-per-node", "4", "--cpus-per-rank", "8")


@pytest.mark.parametrize("name", ["slurm/train_mpirun.sbatch", "lsf/train_mpirun.lsf", "pbs/train.pbs"])
def test_mpich_launch_line(name):
    _, argv = dry_run(ROOT / "jobs" / name, *SHAPE, HPCTRAIN_MPI="mpich", HPCTRAIN_MPIEXEC="mpiexec")
    assert argv[:7] == ["mpiexec", "-n", "16", "-ppn", "4", "-bind-to", "core:8"], argv
    assert not any(a == "-x" or a.startswith("--map-by") for a in argv)      # Hydra forwards the environment
    bind = argv.index(str(ROOT / "jobs/common/bind.sh"))
    assert argv[bind + 1] == str(ROOT / ".venv-mpich/bin/python")


def test_mpich_default_command_and_pbs_nodefile(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n1\nn1\nn2\nn2\n")
    _, argv = dry_run(ROOT / "jobs/pbs/train.pbs", HPCTRAIN_MPI="mpich", PBS_NODEFILE=str(nodefile),
                      PBS_O_WORKDIR=str(ROOT))
    assert argv[0] in ("mpiexec.mpich", "mpiexec") and argv[argv.index("-f") + 1] == str(nodefile)
    assert argv[argv.index("-n") + 1] == "4" and argv[argv.index("-ppn") + 1] == "2"


def test_mpich_staging_uses_its_own_venv_and_tars(tmp_path):
    out, argv = dry_run(ROOT / "jobs/lsf/train_mpirun.lsf", *SHAPE, HPCTRAIN_MPI="mpich", HPCTRAIN_STAGE="1",
                        HPCTRAIN_MPIEXEC="mpiexec", HPCTRAIN_STAGE_TARS=str(tmp_path))
    assert f"-cf {tmp_path}/env.tar.tmp .venv-mpich" in out
    assert "mpiexec -n 4 -ppn 1 tar" in out
    assert argv[argv.index(str(ROOT / "jobs/common/bind.sh")) + 1].endswith("/.venv-mpich/bin/python")


def test_unknown_mpi_is_refused():
    r = subprocess.run(["bash", str(ROOT / "jobs/slurm/train_mpirun.sbatch"), "--dry-run"], capture_output=True,
                       text=True, timeout=60, env=clean_env(HPCTRAIN_MPI="mvapich"), cwd="/")
    assert r.returncode == 2 and "HPCTRAIN_MPI must be openmpi or mpich" in r.stderr
