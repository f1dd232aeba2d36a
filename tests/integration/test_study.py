"""The large-batch study runs end to end and writes its table, JSON and plot."""
import json
import subprocess
import sys

from tests.integration.mpirun import ENV


def test_study_smoke(tmp_path):
    import os
    r = subprocess.run([sys.executable, "-m", "hpctrain", "study", "large-batch", "--epochs", "2", "--batch", "32",
                        "--factor", "4", "--warmup-epochs", "1", "--no-polish", "--out", str(tmp_path)], capture_output=True, text=True,
                       env={**os.environ, **ENV}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.load(open(tmp_path / "study.json"))
    assert [row["global_batch"] for row in rows] == [32, 128, 128, 128]
    assert all(len(row["curve"]) == 2 for row in rows)
    assert rows[0]["test_accuracy"] > 0.8          # the small-batch baseline learns in 2 epochs
    assert (tmp_path / "study.png").stat().st_size > 10_000
    assert "(iv) LARS + warmup + poly" in r.stdout
