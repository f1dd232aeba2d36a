"""The batch scripts under a real Slurm (one node, this host): run, cancel with a checkpoint, resume.

Runs with ``make test-slurm`` (which starts Slurm with scripts/slurm/start.sh and sets
HPCTRAIN_TEST_SLURM=1); skipped otherwise, or when no Slurm node is idle. Jobs run one at a time:
the node has the 2 CPUs a 2-rank job takes.
"""
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain.ops import checkpoint as ck
from tests.integration.mpirun import ENV

ROOT = Path(__file__).resolve().parents[2]


def _slurm_reason() -> str | None:
    if os.environ.get("HPCTRAIN_TEST_SLURM") != "1":
        return "Slurm tests run with `make test-slurm` (HPCTRAIN_TEST_SLURM=1)"
    if not shutil.which("sbatch"):
        return "Slurm is not installed (bash scripts/slurm/start.sh installs and starts it)"
    r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if r.returncode != 0 or not re.search(r"idle|mixed|allocated", r.stdout):
        return f"no Slurm node is up (sinfo: {(r.stdout + r.stderr).strip() or 'nothing'}); run scripts/slurm/start.sh"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_slurm_reason() is not None, reason=_slurm_reason() or "")]


def sbatch(script: str, run_dir: Path, *args: str, env: dict | None = None) -> str:
    cmd = ["sbatch", "--parsable", "--chdir", str(ROOT), "--output", str(run_dir.parent / f"{run_dir.name}-%j.out"),
           str(ROOT / "jobs/slurm" / script), "--run-dir", str(run_dir), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV, **(env or {})}, check=True)
    return r.stdout.strip().split(";")[0]


def job_info(job: str) -> dict:
    r = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True)
    return dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)


def wait_done(job: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = job_info(job)
        if info["JobState"] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return info
        time.sleep(1)
    subprocess.run(["scancel", job])
    raise AssertionError(f"job {job} still {info['JobState']} after {timeout_s} s")


def output(run_dir: Path, job: str) -> str:
    return (run_dir.parent / f"{run_dir.name}-{job}.out").read_text()


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def test_default_job_with_mpirun(tmp_path):
    run_dir = tmp_path / "mpirun"
    job = sbatch("train_mpirun.sbatch", run_dir)
    info = wait_done(job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output(run_dir, job)
    summary = records(run_dir)[-1]
    assert summary["event"] == "summary" and summary["world_size"] == 2 and summary["test_accuracy"] >= 0.95
    assert "mpirun -n 2 --map-by ppr:2:node:PE=1 --bind-to core" in output(run_dir, job)


def test_cancel_checkpoints_then_resubmit_resumes(tmp_path):
    run_dir = tmp_path / "srun"
    job = sbatch("train_srun.sbatch", run_dir)
    deadline = time.monotonic() + 240
    while not (run_dir / "metrics.jsonl").exists() or len(records(run_dir)) < 2:   # config + first epoch
        assert time.monotonic() < deadline and job_info(job)["JobState"] in ("PENDING", "RUNNING"), output(run_dir, job)
        time.sleep(0.5)
    subprocess.run(["scancel", job], check=True)
    info = wait_done(job, 120)
    log = output(run_dir, job)
    assert info["JobState"] == "CANCELLED", log
    last = records(run_dir)[-1]
    assert last["event"] == "stopped" and last["signal"] == "SIGTERM", log
    header, _ = ck.read_file(last["checkpoint"])            # complete, checksum verifies
    assert header["step"] == last["step"] > 0
    assert "srun --mpi=pmix" in log and "stopped by SIGTERM" in log

    # Resubmitting the same script continues from that checkpoint (--resume auto is the default).
    step = header["step"]
    job2 = sbatch("train_srun.sbatch", run_dir, "--", "--max-steps", str(step + 10))
    info = wait_done(job2)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output(run_dir, job2)
    summary = records(run_dir)[-1]
    assert summary["event"] == "summary" and summary["start_step"] == step and summary["steps"] == step + 10
    assert f"resumed from {last['checkpoint']}" in output(run_dir, job2)


def _tree_bytes(top: Path) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, files in os.walk(top) for f in files)


def node_local_stage_root() -> str:
    """/dev/shm where it holds the staged venv twice (sbcast's tar and the tree extracted from
    it), else /tmp: both are node-local places the job scripts document. Extracting the 2 GB venv
    (55 000 files) and removing it took 27 s on this host's /tmp and 8.5 s on tmpfs."""
    need = 2 * _tree_bytes(ROOT / ".venv") + (1 << 30)
    try:
        return "/dev/shm" if shutil.disk_usage("/dev/shm").free > need else "/tmp"
    except OSError:
        return "/tmp"


@pytest.mark.timeout(600)
def test_staged_environment(tmp_path):
    """HPCTRAIN_STAGE=1: the venv and sources are copied to node-local storage and used from there."""
    run_dir = tmp_path / "staged"
    stage_dir = f"{node_local_stage_root()}/hpctrain-stage-test-{os.getpid()}"
    try:
        job = sbatch("train_srun.sbatch", run_dir, "--", "--max-steps", "5",
                     env={"HPCTRAIN_STAGE": "1", "HPCTRAIN_STAGE_TARS": str(tmp_path / "tars"),
                          "HPCTRAIN_STAGE_DIR": stage_dir})
        info = wait_done(job, 400)
        log = output(run_dir, job)
        assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
        assert f"{stage_dir}/.venv/bin/python -m hpctrain" in log
        assert records(run_dir)[-1]["steps"] == 5
        assert not os.path.exists(stage_dir)                # cleaned up after the run
    finally:
        shutil.rmtree(tmp_path / "tars", ignore_errors=True)  # 2 GB
        shutil.rmtree(stage_dir, ignore_errors=True)
