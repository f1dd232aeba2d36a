"""The digits job with ``update.algorithm=odsgd`` through the CLI: the options reach the algorithm, the
final model is the global weights (every rank evaluates the same), accuracy holds; the bench runs."""
import json

import pytest

from tests.integration.inprocess import run_cli
from tests.integration.mpirun import mpirun


@pytest.mark.slow
def test_digits_job_with_odsgd_and_a_slow_link(tmp_path):
    r, _ = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path), "--no-progress",
                      "--set", "update.algorithm=odsgd", "--set", "update.odsgd.warmup_steps=50",
                      "--set", "comm.delay_ms=1"], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    summary = lines[-1]
    assert lines[0]["config"]["update"]["algorithm"] == "odsgd" and summary["algorithm"] == "odsgd"
    assert lines[0]["config"]["comm"]["delay_ms"] == 1.0
    # the record holds every option OD-SGD ran with, the ones left at their defaults too
    assert lines[0]["config"]["update"]["odsgd"] == {"warmup_steps": 50, "local_lr": 0.0, "local_momentum": 0.0,
                                                   "dc_lambda": 0.0}
    assert "local_update" in summary["phases_s"]          # the OD-SGD path ran, not SSGD's
    assert summary["test_accuracy"] >= 0.95, summary


def test_option_errors_are_one_line(tmp_path):
    """The config refusal's real launch: status 2 reaches mpiexec."""
    r, _ = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path), "--no-progress",
                      "--set", "update.algorithm=odsgd", "--set", "update.odsgd.local_momentum=1.5"], timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "update.odsgd.local_momentum: must be in [0, 1)" in r.stderr


def test_lars_without_a_local_lr_is_one_line(tmp_path, capsys):
    r = run_cli(capsys, "--run-dir", str(tmp_path), "--no-progress", "--optimizer", "lars",
                "--set", "update.algorithm=odsgd")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "hpctrain: error: update.odsgd.local_lr: set it explicitly with LARS" in r.stderr


@pytest.mark.slow
def test_bench_sync_prints_both_algorithms(tmp_path):
    out = tmp_path / "rows.json"
    r, _ = mpirun(2, ["-m", "hpctrain", "bench", "sync", "--model", "digits_cnn", "--image-size", "8",
                      "--steps", "3", "--repeats", "1", "--comm-delay-ms", "0,5", "--json", str(out)], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [(row["delay_ms"], row["algorithm"]) for row in rows] == [(0, "ssgd"), (0, "odsgd"), (5, "ssgd"),
                                                                    (5, "odsgd")]
    assert all(row["speedup"] > 0 and row["steps_per_s"] > 0 for row in rows)
    assert "x SSGD" in r.stdout and "hidden" in r.stdout

