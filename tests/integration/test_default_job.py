"""The embedded default job: digits, small CNN, synchronous SGD, ≥ 95 % test accuracy."""
import json

import pytest

from tests.integration.mpirun import mpirun


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 4])
def test_default_job_reaches_target(tmp_path, n):
    r, secs = mpirun(n, ["-m", "hpctrain", "--run-dir", str(tmp_path), "--no-progress"], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    summary = lines[-1]
    assert lines[0]["event"] == "config" and summary["event"] == "summary"
    assert summary["world_size"] == n
    assert summary["test_accuracy"] >= 0.95, summary
    assert summary["gpu_time_s"] == pytest.approx(summary["wall_s"] * n)
    assert "test accuracy" in r.stdout
    print(f"n={n}: {summary['test_accuracy']:.4f} acc, wall {summary['wall_s']:.1f}s, launch {secs:.1f}s")
