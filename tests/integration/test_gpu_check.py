"""``scripts/gpu-check`` (issue 34): its dry run on the CPU, and the driver's budget, timeouts and
table. The dry run is what keeps the one-call GPU check from rotting where no GPU is: every step
runs its CPU form or skips with its reason, and the test files the GPU steps name exist."""
import json
import os
import subprocess
import sys

from tests.scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu-check")
gpu_check = load_script("gpu-check", "gpu_check")


def test_dry_run_runs_or_skips_every_step_with_its_reason(tmp_path):
    """Run from a process with MPI initialised (other test files in this worker import it):
    its singleton's variables reach the driver, which must not pass them to mpiexec."""
    from mpi4py import MPI  # noqa: F401
    r = subprocess.run([sys.executable, SCRIPT, "--cpu", "--python", sys.executable, str(tmp_path)],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode == 0, (r.stdout, r.stderr)
    summary = json.loads((tmp_path / "summary.json").read_text())
    names = [s.name for s in gpu_check.steps("py", "mpiexec", str(tmp_path), True)]
    assert [row["step"] for row in summary["steps"]] == names and len(names) == 10
    for row, step in zip(summary["steps"], gpu_check.steps("py", "mpiexec", str(tmp_path), True)):
        if step.gpu_only:
            assert row["status"] == "skipped: needs a CUDA device (dry run)", row
        else:
            assert row["status"] == "ok" and json.loads(row["note"]), row
    notes = {row["step"]: json.loads(row["note"]) for row in summary["steps"] if row["note"]}
    assert notes["environment"]["gpu"] == "none" and "CUDA torch" in notes["environment"]["missing"]
    assert notes["LARS kernel vs foreach vs CPU"]["ok"] is True
    resnet = notes["ResNet-50 b64 224: torch vs hpctrain"]["rows"]
    assert [x["precision"] for x in resnet] == ["fp32", "bf16+channels_last"]
    assert all(x["torch_img_s"] > 0 and x["hpctrain_img_s"] > 0 for x in resnet)
    log = (tmp_path / "log.txt").read_text()
    assert "tests/mpi/test_gpu_sync.py" in log and "train.device=cuda" in log
    assert "| fp32 |" in (tmp_path / "summary.md").read_text()


def test_launch_env_drops_what_an_mpi_process_leaves_for_its_children():
    env = {"PMIX_SERVER_URI4": "x", "PMIX_RANK": "0", "PMIX_MCA_psec": "native", "OMPI_MCA_ess": "singleton",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_COMM_WORLD_SIZE": "1", "PATH": "/bin"}
    assert gpu_check.launch_env(env) == {**gpu_check.MPI_ENV, "PMIX_MCA_psec": "native",
                                         "OMPI_MCA_rmaps_base_oversubscribe": "1", "PATH": "/bin"}


def step(argv, timeout_s=10, min_s=1, gpu_only=False):
    return gpu_check.Step("s", timeout_s, argv, gpu_only=gpu_only, min_s=min_s)


def test_budget_skips_the_tail_rather_than_overrun():
    assert gpu_check.plan(step(["x"], timeout_s=90, min_s=15), 600, False) == (90, "")
    timeout_s, why = gpu_check.plan(step(["x"], timeout_s=90, min_s=15), 50, False)
    assert timeout_s == 50 - gpu_check.RESERVE_S and why == ""        # shortened to fit
    assert gpu_check.plan(step(["x"], min_s=15), 12, False)[1].startswith("budget: 7 s left")
    assert gpu_check.plan(step(["x"], gpu_only=True), 600, True)[1] == "needs a CUDA device (dry run)"
    assert "MISSING tests/gone.py" in gpu_check.plan(step(["tests/gone.py"], gpu_only=True), 600, True)[1]


def test_a_step_over_its_timeout_is_stopped_and_marked(tmp_path):
    with open(tmp_path / "log", "w") as log:
        status, _, seconds = gpu_check.run_step(step([sys.executable, "-c", "import time; time.sleep(30)"]), 0.5, log)
        assert status == "timeout" and seconds < 10
        status, note, _ = gpu_check.run_step(step([sys.executable, "-c", "print('RESULT {\"a\": 1}')"]), 20, log)
        assert status == "ok" and json.loads(note) == {"a": 1}
    assert gpu_check.outcome(1, "x\n== 3 passed, 1 skipped in 2.0s ==")[1] == "3 passed, 1 skipped in 2.0s"
