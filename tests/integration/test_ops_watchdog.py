"""The stall watchdog in a real run: a rank stuck before its step is named while the other waits."""
import re

from tests.integration.mpirun import mpirun


def test_watchdog_names_the_stalled_rank(tmp_path):
    r, _ = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path), "--no-progress", "--max-steps", "8",
                      "--set", "run.watchdog_s=1"], env={"HPCTRAIN_INJECT_FAULT": "1:5:sleep=3"}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]        # a stall is reported, not fatal
    assert re.search(r"hpctrain: watchdog: no progress for \d+ s: rank 1 is at the start of step 5; "
                     r"rank 0 waits after 'backward' of step 5\n", r.stderr), r.stderr[-2000:]
    assert r.stderr.count("hpctrain: watchdog:") <= 3      # once per timeout period, not per poll
