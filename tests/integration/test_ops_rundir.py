"""A run directory belongs to one job: a second job stops at start-up naming the holder, writing
nothing; the lock does not outlive a killed job; ``--resume auto`` refuses another run's checkpoint."""
import json
import os
import signal
import socket
import subprocess
import sys

from tests.integration.inprocess import run_cli
from tests.integration.mpirun import hpctrain_lines, mpirun, rank_pids, start_training

ARGS = ["-m", "hpctrain", "--no-progress"]


def test_second_job_on_a_run_dir_stops_naming_the_holder(tmp_path):
    # the holder only has to hold the lock: a 50 ms emulated link (slept) keeps its core free
    first = start_training(tmp_path, 1, "--epochs", "2000", "--set", "comm.delay_ms=50")
    try:
        [pid] = rank_pids(first.pid)
        before = {n: (tmp_path / n).read_bytes() for n in ("run_id", ".lock")}
        r, secs = mpirun(2, [*ARGS, "--run-dir", str(tmp_path), "--seed", "5", "--max-steps", "2"], timeout=120)
        assert r.returncode == 2, r.stderr[-3000:]
        lines = hpctrain_lines(r.stderr, "hpctrain:")
        assert lines == [f"hpctrain: error: run directory {tmp_path} is in use by pid {pid} on host "
                         f"{socket.gethostname()} since {json.loads(before['.lock'])['start']} (lock "
                         f"{tmp_path}/.lock); wait for that job to end or choose another --run-dir"], lines
        assert {n: (tmp_path / n).read_bytes() for n in before} == before
        events = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [e["config"]["train"]["seed"] for e in events if e["event"] == "config"] == [0]
        assert not (tmp_path / "checkpoints").exists()
        os.kill(pid, signal.SIGKILL)             # a crash: the kernel drops the lock with the process
        first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    r, _ = mpirun(2, [*ARGS, "--run-dir", str(tmp_path), "--max-steps", "2", "--resume", "auto"], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "run_id").read_bytes() == before["run_id"]          # a resume keeps the run's identity


def test_resume_auto_refuses_another_runs_checkpoint(tmp_path, capsys):
    r = run_cli(capsys, *ARGS[2:], "--run-dir", str(tmp_path), "--max-steps", "3")         # in process: one rank
    assert r.returncode == 0, r.stderr[-3000:]
    assert status(tmp_path)[0] == 0
    old = tmp_path / "checkpoints" / "ckpt-000000003.pt"
    # a new run in the same directory fails before its first checkpoint, then is resumed
    r, _ = mpirun(1, [*ARGS, "--run-dir", str(tmp_path), "--max-steps", "3", "--seed", "5"], timeout=120,
                  env={"HPCTRAIN_INJECT_FAULT": "0:1"})
    assert r.returncode != 0 and "injected fault" in r.stderr
    # the refusal is decided at start-up, before any step: the CLI's entry in process
    r = run_cli(capsys, *ARGS[2:], "--run-dir", str(tmp_path), "--max-steps", "3", "--seed", "5", "--resume", "auto")
    assert r.returncode == 2, r.stderr[-3000:]
    lines = hpctrain_lines(r.stderr, "hpctrain:")
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    run_id = (tmp_path / "run_id").read_text().strip()
    assert lines[0].startswith(f"hpctrain: error: checkpoint {old} belongs to run ") and \
        f"not to this run ({run_id}) and this run has none" in lines[0], lines
    assert status(tmp_path) == (2, lines[0].replace("hpctrain: error: ", "hpctrain: failed: ", 1)
                                + f" ({json.loads((tmp_path / 'state.json').read_text())['time']})")


def status(run_dir):
    r = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(run_dir)], capture_output=True, text=True)
    return r.returncode, r.stdout.strip()
