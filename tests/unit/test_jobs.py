"""Batch scripts in jobs/: syntax, the launch lines they print with --dry-run, GPU binding."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for d in ("slurm", "pbs", "lsf") for p in (ROOT / "jobs" / d).iterdir() if p.is_file())
SHELL_FILES = SCRIPTS + sorted((ROOT / "jobs" / "common").glob("*.sh")) + [ROOT / "scripts/slurm/start.sh"]
SCHEDULER_VARS = ("SLURM_", "PBS_", "LSB_", "LS_SUBCWD", "OMPI_", "PMIX_", "MV2_", "MPI_LOCALRANKID",
                  "JSM_", "PALS_", "CUDA_VISIBLE_DEVICES", "HPCTRAIN_", "NODES", "RANKS_PER_NODE",
                  "GPUS_PER_NODE", "CPUS_PER_RANK", "RUN_DIR", "CONFIG", "RESUME")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_VARS)}
    return {**env, **extra}


def dry_run(script, *args, **env):
    r = subprocess.run(["bash", str(script), "--dry-run", *args], capture_output=True, text=True, timeout=60,
                       env=clean_env(HPCTRAIN_DRY_RUN="1", **env), cwd="/")  # must find the repo themselves
    assert r.returncode == 0, r.stderr
    launch = [line for line in r.stdout.splitlines() if "jobs/common/bind.sh" in line]
    assert len(launch) == 1, r.stdout
    return r.stdout, shlex.split(launch[0])


def test_scripts_exist_for_every_scheduler():
    names = {p.relative_to(ROOT / "jobs").as_posix() for p in SCRIPTS}
    assert names == {"slurm/train_srun.sbatch", "slurm/train_mpirun.sbatch", "pbs/train.pbs",
                     "lsf/train_jsrun.lsf", "lsf/train_mpirun.lsf"}


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: p.name)
def test_bash_syntax(path):
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


SHAPE = ("--nodes", "4", "--ranks-per-node", "4", "--gpus-per-node", "4", "--cpus-per-rank", "8",
         "--config", "run.toml", "--run-dir", "runs/r50", "--", "--epochs", "3")


def app_tail(argv):
    """The part after the bind wrapper: python -m hpctrain …"""
    i = argv.index(str(ROOT / "jobs/common/bind.sh"))
    return argv[:i], argv[i + 1:]


@pytest.mark.parametrize("name, launcher", [
    ("slurm/train_srun.sbatch", ["srun", "--mpi=pmix", "--nodes=4", "--ntasks-per-node=4", "--ntasks=16",
                                 "--cpus-per-task=8", "--cpu-bind=cores"]),
    ("slurm/train_mpirun.sbatch", ["mpirun", "-n", "16", "--map-by", "ppr:4:node:PE=8", "--bind-to", "core"]),
    ("pbs/train.pbs", ["mpiexec", "-n", "16", "--map-by", "ppr:4:node:PE=8", "--bind-to", "core"]),
    ("lsf/train_mpirun.lsf", ["mpirun", "-n", "16", "--map-by", "ppr:4:node:PE=8", "--bind-to", "core"]),
    ("lsf/train_jsrun.lsf", ["jsrun", "--nrs", "16", "--rs_per_host", "4", "--tasks_per_rs", "1",
                             "--cpu_per_rs", "8", "--gpu_per_rs", "1", "--bind", "packed:8"]),
])
def test_dry_run_launch_line(name, launcher):
    out, argv = dry_run(ROOT / "jobs" / name, *SHAPE)
    head, app = app_tail(argv)
    assert head[:len(launcher)] == launcher or all(a in head for a in launcher), head
    assert app[:3] == [str(ROOT / ".venv/bin/python"), "-m", "hpctrain"]
    for pair in (["--run-dir", "runs/r50"], ["--config", "run.toml"], ["--set", "train.threads=8"],
                 ["--set", "ckpt.resume=auto"]):
        assert any(app[i:i + 2] == pair for i in range(len(app))), (pair, app)
    assert app[-2:] == ["--epochs", "3"]
    assert "OMP_NUM_THREADS=8" in out and "4 node(s) x 4 rank(s)" in out


def test_mpirun_scripts_export_the_environment():
    _, argv = dry_run(ROOT / "jobs/slurm/train_mpirun.sbatch", "--cpus-per-rank", "1")
    exported = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert {"PATH", "OMP_NUM_THREADS", "HDF5_USE_FILE_LOCKING", "HPCTRAIN_GPUS_PER_NODE"} <= exported


def test_pals_launcher_and_jsrun_without_gpus():
    _, argv = dry_run(ROOT / "jobs/pbs/train.pbs", "--nodes", "2", "--ranks-per-node", "4", "--cpus-per-rank", "8",
                      MPI_LAUNCHER="pals")
    assert argv[:9] == ["mpiexec", "-n", "8", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth"]
    _, argv = dry_run(ROOT / "jobs/lsf/train_jsrun.lsf", "--nodes", "2", "--ranks-per-node", "4",
                      "--cpus-per-rank", "2")
    assert argv[:11] == ["jsrun", "--nrs", "2", "--rs_per_host", "1", "--tasks_per_rs", "4", "--cpu_per_rs", "8",
                         "--gpu_per_rs", "0"]


def test_shape_comes_from_the_slurm_allocation():
    _, argv = dry_run(ROOT / "jobs/slurm/train_srun.sbatch", SLURM_JOB_ID="77", SLURM_JOB_NUM_NODES="3",
                      SLURM_NTASKS_PER_NODE="2", SLURM_CPUS_PER_TASK="5", SLURM_GPUS_PER_NODE="a100:2",
                      SLURM_SUBMIT_DIR=str(ROOT))
    assert "--ntasks=6" in argv and "--cpus-per-task=5" in argv
    _, app = app_tail(argv)
    assert "runs/job-77" in app


def test_shape_comes_from_the_pbs_nodefile(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("a\na\na\nb\nb\nb\n")             # select=2:mpiprocs=3
    _, argv = dry_run(ROOT / "jobs/pbs/train.pbs", PBS_NODEFILE=str(nodefile), PBS_O_WORKDIR=str(ROOT),
                      PBS_JOBID="5.server")
    assert argv[:3] == ["mpiexec", "-n", "6"]
    assert argv[argv.index("--map-by") + 1].startswith("ppr:3:node:PE=")
    assert argv[argv.index("--hostfile") + 1] == str(nodefile)


def test_staging_plan_is_printed(tmp_path):
    out, argv = dry_run(ROOT / "jobs/slurm/train_srun.sbatch", HPCTRAIN_STAGE="1",
                        HPCTRAIN_STAGE_DIR="/tmp/stage-x", HPCTRAIN_STAGE_TARS=str(tmp_path))
    assert f"sbcast --force {tmp_path}/env.tar /tmp/stage-x/env.tar" in out
    assert "tar -C /tmp/stage-x -xf /tmp/stage-x/env.tar" in out
    assert "# PYTHONPATH=/tmp/stage-x/src" in out
    _, app = app_tail(argv)
    assert app[0] == "/tmp/stage-x/.venv/bin/python"
    assert not (tmp_path / "env.tar").exists()              # a dry run changes nothing


def test_staged_source_imports_the_tools_from_the_copy(tmp_path):
    """src.tar puts kernels/ and data_tools/ inside the staged hpctrain/ (their installed place), so
    the launch's PYTHONPATH=<stage>/src imports hpctrain.kernels and hpctrain.data_tools from the copy."""
    tars = tmp_path / "tars"
    tars.mkdir()
    (tars / "env.tar").write_bytes(b"")                    # present: only src.tar is packed
    r = subprocess.run(["bash", "-c", f"source {ROOT}/jobs/common/stage.sh && hpctrain_stage_pack"],
                       env=clean_env(HPCTRAIN_HOME=str(ROOT), HPCTRAIN_STAGE_TARS=str(tars)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    subprocess.run(["tar", "-C", str(tmp_path), "-xf", str(tars / "src.tar")], check=True)
    assert sorted(os.listdir(tmp_path / "src")) == ["hpctrain"]
    code = "import hpctrain.data_tools.sources as s, hpctrain.kernels._table as k; print(s.__file__, k.__file__)"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == [str(tmp_path / "src/hpctrain/data_tools/sources.py"),
                                  str(tmp_path / "src/hpctrain/kernels/_table.py")], out.stderr


def bind(*cmd, **env):
    r = subprocess.run([str(ROOT / "jobs/common/bind.sh"), *cmd], capture_output=True, text=True,
                       env=clean_env(**env))
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("env, expect", [
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "3", "HPCTRAIN_GPUS_PER_NODE": "4"}, "3 3"),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "5", "HPCTRAIN_GPUS_PER_NODE": "4"}, "5 1"),   # 2 ranks per GPU
    ({"SLURM_LOCALID": "2", "HPCTRAIN_GPUS_PER_NODE": "4"}, "2 2"),
    ({"MV2_COMM_WORLD_LOCAL_RANK": "1", "HPCTRAIN_GPUS_PER_NODE": "2"}, "1 1"),
    ({"PMIX_LOCAL_RANK": "1", "SLURM_LOCALID": "0", "HPCTRAIN_GPUS_PER_NODE": "8"}, "1 1"),
    # mpirun inside sbatch: every rank inherits SLURM_LOCALID=0; Open MPI's value must win
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "2", "SLURM_LOCALID": "0", "HPCTRAIN_GPUS_PER_NODE": "4"}, "2 2"),
    # the scheduler already restricted the devices: pick from its list
    ({"SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "1 5"),
    ({"JSM_NAMESPACE_LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "3"}, "0 3"),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}, "1 unset"),                                # CPU-only
])
def test_bind_sets_device_from_local_rank(env, expect):
    assert bind("bash", "-c", 'echo "$HPCTRAIN_LOCAL_RANK ${CUDA_VISIBLE_DEVICES-unset}"', **env) == expect


def test_bind_passes_arguments_and_exit_status_through():
    r = subprocess.run([str(ROOT / "jobs/common/bind.sh"), "bash", "-c", 'echo "$1|$2"; exit 7', "_", "a b", "c"],
                       capture_output=True, text=True, env=clean_env())
    assert r.returncode == 7 and r.stdout == "a b|c\n"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_option_runs_the_users_own_script(script):
    """--script: a Horovod or DDP script gets the same shape and binding, and only its own
    arguments (no --run-dir or hpctrain options)."""
    out, argv = dry_run(script, "--nodes", "2", "--ranks-per-node", "4", "--script",
                        "examples/horovod/train.py", "--", "--epochs", "3")
    _, app = app_tail(argv)
    assert app[1:] == ["examples/horovod/train.py", "--epochs", "3"], app
    assert app[0].endswith("python")
