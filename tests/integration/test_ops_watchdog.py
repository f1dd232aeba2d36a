"""The stall watchdog in a real run: a rank stuck before its step is named while the other waits;
a rank stopped in place ends the job with status 4."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.integration.mpirun import MPIEXEC, hpctrain_lines, mpirun, rank_pids, start_training


def test_watchdog_names_the_stalled_rank(tmp_path):
    r, _ = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path), "--no-progress", "--max-steps", "8",
                      "--set", "run.watchdog_s=1"], env={"HPCTRAIN_INJECT_FAULT": "1:5:sleep=3"}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]        # a stall is reported, not fatal
    assert re.search(r"hpctrain: watchdog: no progress for \d+ s: rank 1 is at the start of step 5; "
                     r"rank 0 waits after 'backward' of step 5\n", r.stderr), r.stderr[-2000:]
    step5 = [x for x in hpctrain_lines(r.stderr, "hpctrain: watchdog:") if "of step 5" in x]
    assert len(step5) <= 3                           # once per timeout period, not per poll


def world_rank(pid: int) -> int:
    """A rank's number from its environment (Open MPI's or Hydra's variable)."""
    env = dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)
    return int(env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK", -1)))


@pytest.mark.alone              # the end within the abort bound: a wall time
@pytest.mark.parametrize("victim", [1, 0])
def test_stopped_rank_ends_the_job_with_status_4(tmp_path, victim):
    """A rank stopped in place (SIGSTOP) is named and the job ends with status 4 within the abort
    bound plus a few seconds, instead of holding the allocation to its time limit. Rank 0 watches
    every rank; when rank 0 itself is stopped, rank 1 ends the job after its own bound (x1.1 + 10 s)."""
    abort_s = 4
    bound = abort_s + 10 if victim else abort_s * 1.1 + 10 + 10
    proc = start_training(tmp_path, 2, "--epochs", "2000", "--set", "run.watchdog_s=1",
                          "--set", f"run.watchdog_abort_s={abort_s}")
    try:
        ranks = {world_rank(p): p for p in rank_pids(proc.pid)}
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[victim], signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        secs = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 4, err[-3000:]
    assert secs < bound, secs
    [line] = [x for x in err.splitlines() if "ending the job" in x]
    if victim == 1:
        # stopped inside the allreduce its progress equals rank 0's: its silent heartbeat names it
        assert re.fullmatch(r"hpctrain: watchdog: no progress for \d+ s: rank 1 is (after '\w+'|at the start) of "
                            r"step \d+(, silent for \d+ s \(stopped, or its node is down\))?; rank 0 waits? .* of "
                            r"step \d+; ending the job \(status 4\)", line), line
        last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
        assert last["event"] == "stalled" and last["message"] in line
    else:
        assert re.fullmatch(r"hpctrain: watchdog: no progress for \d+ s: rank 1 waits .*, and rank 0's watchdog "
                            r"has not ended the job \(rank 0 may be stopped itself\); ending the job \(status 4\)",
                            line), line
    r = subprocess.run([sys.executable, "-m", "hpctrain", "status", "--wait", "10", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 4 and r.stdout.startswith("hpctrain: stalled: no progress for "), r.stdout
    print(f"{MPIEXEC}: status 4 {secs:.1f} s after SIGSTOP of rank {victim} (abort bound {abort_s} s)")
