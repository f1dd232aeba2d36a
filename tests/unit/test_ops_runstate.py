"""``hpctrain status RUN_DIR``: the run's recorded state back as the documented exit status."""
import json
import os
import subprocess
import sys
import threading
import time

from hpctrain.ops import runstate
from hpctrain.ops.runlock import RunLock


def status(run_dir):
    r = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(run_dir)], capture_output=True, text=True,
                       timeout=60)
    return r.returncode, r.stdout.strip()


def test_each_recorded_state_gives_its_status(tmp_path):
    runstate.record(str(tmp_path), "done", steps=30, test_accuracy=0.4125)
    assert status(tmp_path) == (0, f"hpctrain: done: 30 steps, test accuracy 41.25% "
                                   f"({json.loads((tmp_path / 'state.json').read_text())['time']})")
    runstate.record(str(tmp_path), "stopped", signal="SIGTERM", step=68, checkpoint="c/ckpt-000000068.pt")
    code, line = status(tmp_path)
    assert code == 3 and line.startswith("hpctrain: stopped by SIGTERM at step 68 after writing c/ckpt-000000068.pt")
    runstate.record(str(tmp_path), "failed", message="config optim.lr: must be > 0")
    code, line = status(tmp_path)
    assert code == 2 and line.startswith("hpctrain: failed: config optim.lr: must be > 0 (")
    runstate.record(str(tmp_path), "stalled", message="no progress for 900 s: rank 1 is …")
    code, line = status(tmp_path)
    assert code == 4 and line.startswith("hpctrain: stalled: no progress for 900 s: rank 1 is …")


def test_running_while_locked_then_failed_when_killed_without_a_record(tmp_path):
    runstate.record(str(tmp_path), "running")
    lock = RunLock(str(tmp_path))
    lock.acquire()
    try:
        code, line = status(tmp_path)
        assert code == 1 and line.startswith(f"hpctrain: running: pid {os.getpid()} on host "), line
    finally:
        lock.release()
    code, line = status(tmp_path)                  # lock free, state still "running": it was killed
    assert code == runstate.UNRECORDED == 5 and "ended without recording how" in line, line


def test_no_run_and_usage(tmp_path):
    assert status(tmp_path / "nothing") == (2, f"hpctrain: failed: no hpctrain run in {tmp_path / 'nothing'}")
    assert runstate.main([]) == 2 and runstate.main(["--help"]) == 0


def test_a_state_older_than_the_job_is_not_its_own(tmp_path):
    """A job that died before taking the run directory (an MPI start-up failure) must not inherit
    the previous job's "stopped": the batch scripts pass their launch time."""
    runstate.record(str(tmp_path), "stopped", signal="SIGTERM", step=5, checkpoint="c")
    t = json.loads((tmp_path / "state.json").read_text())["unix_time"]
    assert runstate.main(["--since", str(t - 10), str(tmp_path)]) == 3
    line, code = runstate.describe(str(tmp_path), since=t + 10)
    assert code == 5 and line.startswith(f"failed: no job recorded a state in {tmp_path} since "), line


def test_a_first_job_that_died_before_taking_the_run_directory_is_unrecorded(tmp_path):
    """The batch scripts make the run directory before launching: a first job that never took it
    (MPI start-up failure) is 5 with --since, as the table says, not the user error 2."""
    line, code = runstate.describe(str(tmp_path), since=time.time())
    assert code == 5 and line.startswith(f"failed: no job recorded a state in {tmp_path} since "), line
    assert runstate.describe(str(tmp_path))[1] == 2                 # without --since: nothing to say


def test_wait_outlasts_a_holder_that_is_still_exiting(tmp_path):
    """A launcher may return before its aborted ranks have exited (MPICH's Hydra after MPI_Abort):
    ``--wait`` asks again while the lock is held, so the batch scripts read the recorded end."""
    runstate.record(str(tmp_path), "stalled", message="no progress for 900 s: rank 1 is …")
    lock = RunLock(str(tmp_path))
    lock.acquire()
    releaser = threading.Timer(0.5, lock.release)
    try:
        assert runstate.main([str(tmp_path)]) == 1                  # held: still running
        releaser.start()
        t0 = time.monotonic()
        assert runstate.main(["--wait", "10", str(tmp_path)]) == 4
        assert 0.4 < time.monotonic() - t0 < 5
    finally:
        releaser.join()
        lock.release()
