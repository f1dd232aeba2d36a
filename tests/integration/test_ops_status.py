"""Status 3 whatever receives the stop signal. The ranks always stop with 3 after a checkpoint;
the launcher may not say so (Open MPI's mpiexec exits 1 when itself signalled, Hydra sometimes 0),
so ``hpctrain status RUN_DIR`` gives the run's own, and the batch scripts use it."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.mpirun import ENV, IMPL, MPIEXEC, hpctrain_lines, rank_pids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def status(run_dir):
    r = subprocess.run([sys.executable, "-m", "hpctrain", "status", "--wait", "10", str(run_dir)],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout.strip()


def wait_for_first_epoch(proc, run_dir, timeout=180):
    metrics, deadline = os.path.join(str(run_dir), "metrics.jsonl"), time.monotonic() + timeout
    while not (os.path.exists(metrics) and '"epoch"' in open(metrics).read()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)


def launch(argv, **kw):
    return subprocess.Popen(argv, env={**os.environ, **ENV, **kw.pop("env", {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def finish(proc):
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return err


# The ranks only have to be mid-training when the signal lands. Open MPI's mpirun, signalled, holds
# the signal for sigkill_timeout (4 s here) and the ranks train on meanwhile: a 50 ms emulated link
# (slept, not spun) keeps them idle then, leaving the cores to the tests beside this one. Hydra
# passes the signal on at once, so there the slower first epoch would only add to the wait.
IDLING = ["--epochs", "2000", *(["--set", "comm.delay_ms=50"] if IMPL == "openmpi" else [])]
TRAIN = [sys.executable, "-m", "hpctrain", "--no-progress", *IDLING, "--run-dir"]


@pytest.mark.parametrize("how", ["kill -TERM mpiexec", "Ctrl-C", "kill -TERM timeout"])
def test_stop_through_the_launcher_is_status_3_by_hpctrain_status(tmp_path, how):
    """``kill`` of the launcher; Ctrl-C (SIGINT to the terminal's foreground process group: the
    launcher is started in a session of its own here, as a shell's job); a ``timeout`` wrapper
    passing a SIGTERM on (its expiry sends the same SIGTERM, but a test cannot time it). Under
    Open MPI with ``--foreground``, as docs/operations.md says: a plain ``timeout`` also signals its
    process group, and mpirun takes the second SIGTERM as "terminate now" (no checkpoint, no line)
    in some runs; Hydra keeps the job either way."""
    argv = [MPIEXEC, "-n", "2", *TRAIN, str(tmp_path)]
    if "timeout" in how:
        argv = ["timeout", *(["--foreground"] if IMPL == "openmpi" else []), "600", *argv]
    # Open MPI's default sigkill_timeout (1 s) kills ranks still writing their checkpoint on a
    # loaded host (no line, no status); docs/operations.md tells users to raise it, as here.
    proc = launch(argv, start_new_session=True, env={"OMPI_MCA_odls_base_sigkill_timeout": "4"})
    wait_for_first_epoch(proc, tmp_path)
    if how == "Ctrl-C":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    err = finish(proc)
    assert "Traceback" not in err, err[-3000:]
    lines = hpctrain_lines(err, "hpctrain:")
    assert len(lines) == 1 and lines[0].startswith("hpctrain: stopped by SIG"), err[-3000:]
    code, line = status(tmp_path)
    assert code == 3, line
    assert line.startswith(lines[0].partition(";")[0]), (line, lines)      # same signal, step and file
    print(f"{MPIEXEC}, {how}: launcher status {proc.returncode}, hpctrain status {code}")


def test_batch_script_repairs_the_status_of_a_signalled_mpirun(tmp_path):
    """The mpirun/mpiexec that a batch script started is signalled directly (a site's wrapper, a
    prolog killing the step): the script returns the run's 3, not the launcher's 1 or 0."""
    # Open MPI's mpirun, itself signalled, waits sigkill_timeout before passing SIGTERM on and as
    # long again before SIGKILL (jobs/common/env.sh); 4 s: the digits job's checkpoint needs far
    # less, and each second of the first wait is two ranks still training.
    env = {"HPCTRAIN_MPI": IMPL, "HPCTRAIN_MPIEXEC": MPIEXEC, "HPCTRAIN_PYTHON": sys.executable,
           "OMPI_MCA_odls_base_sigkill_timeout": "4"}
    proc = launch(["bash", os.path.join(ROOT, "jobs/lsf/train_mpirun.lsf"), "--nodes", "1", "--ranks-per-node", "2",
                   "--cpus-per-rank", "1", "--run-dir", str(tmp_path), "--", *IDLING], env=env, cwd=ROOT)
    wait_for_first_epoch(proc, tmp_path)
    [launcher] = [p for p in os.listdir("/proc") if p.isdigit() and proc.pid in _parents(int(p))
                  and rank_pids(int(p)) and _ppid(int(p)) == proc.pid]
    os.kill(int(launcher), signal.SIGTERM)
    err = finish(proc)
    assert proc.returncode == 3, err[-3000:]
    assert "hpctrain: stopped by SIGTERM" in err
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["state"] == "stopped" and state["signal"] == "SIGTERM"


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _parents(pid: int) -> list[int]:
    out = []
    while pid > 1:
        pid = _ppid(pid)
        out.append(pid)
    return out
