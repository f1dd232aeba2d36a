"""Ranks of a Horovod script that call different collectives (and do not catch the error every
rank raises), or where one never comes: the job ends promptly with a non-zero status and one line
naming the tensor and the ranks, not a hang; a script that catches the error goes on."""
import os
import re

import pytest

from tests.integration.mpirun import mpirun

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "horovod_mismatch.py")
STALL = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3"}


def run(n, mode):
    r, secs = mpirun(n, [FIXTURE, mode], timeout=120, env=STALL)
    errors = [line[line.index("hpctrain.horovod:"):] for line in r.stderr.splitlines()
              if "hpctrain.horovod:" in line and "warning" not in line]
    return r, secs, errors


def test_agreeing_ranks_finish():
    r, _, errors = run(2, "ok")
    assert r.returncode == 0 and not errors, r.stderr[-3000:]
    # (the launcher may forward one rank's line and another's newline in either order)
    assert sorted(re.findall(r"rank (\d): \[1\.0, 1\.0, 1\.0, 1\.0\]", r.stdout)) == ["0", "1"], r.stdout


@pytest.mark.parametrize("n, mode, theirs, odd", [
    (2, "shape", "rank 0: allreduce 'loss' float32 [4] op=Average", "rank 1: allreduce 'loss' float32 [5] op=Average"),
    (2, "dtype", "rank 0: allreduce 'loss' float32 [4] op=Average", "rank 1: allreduce 'loss' float64 [4] op=Average"),
    (3, "name", "ranks 0,1: allreduce 'loss' float32 [4] op=Average", "rank 2: allreduce 'lost' float32 [4] op=Average"),
    (2, "op", "rank 0: allreduce 'loss' float32 [4] op=Average", "rank 1: allreduce 'loss' float32 [4] op=Sum"),
])
def test_mismatch_ends_the_job_with_one_line(n, mode, theirs, odd):
    r, secs, errors = run(n, mode)
    assert r.returncode != 0 and "rank" not in r.stdout, r.stdout
    assert secs < 60
    assert len(errors) == 1, r.stderr[-3000:]
    assert errors[0] == (f"hpctrain.horovod: ranks called different collectives ({theirs}; {odd}); "
                         "every rank must make the same calls in the same order")


def test_a_caught_mismatch_lets_the_job_go_on():
    r, _, errors = run(3, "caught")
    assert r.returncode == 0 and not errors, r.stderr[-3000:]
    assert sorted(re.findall(r"rank (\d): caught RuntimeError, then \[3\.0, 3\.0\]", r.stdout)) == ["0", "1", "2"], r.stdout


def test_a_rank_that_never_comes_is_named_after_the_stall_time():
    r, secs, errors = run(2, "skip")
    assert r.returncode != 0 and "rank" not in r.stdout, r.stdout
    assert secs < 60                                  # the missing rank sleeps 300 s
    assert "hpctrain.horovod: warning: rank 1 not at allreduce 'loss' float32 [4] op=Average" in r.stderr
    assert errors == ["hpctrain.horovod: rank 1 did not reach allreduce 'loss' float32 [4] op=Average within "
                      "3 s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS); ending the job"], r.stderr[-3000:]
