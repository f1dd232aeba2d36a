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


def test_held_out_smoke(tmp_path):
    """study held-out on the generated tabular data: three variants and, with --small-lamb, LAMB at
    the small batch; the recipe's start-up lines, the table, the line of LAMB against itself and
    held_out.json (mean and spread per variant)."""
    import os
    r = subprocess.run([sys.executable, "-m", "hpctrain", "study", "held-out", "--datasets", "tabular", "--seeds", "1",
                        "--epochs", "6", "--batch", "256", "--factor", "4", "--small-lamb", "--cache-dir", str(tmp_path / "cache"),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True,
                       env={**os.environ, **ENV}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "recipe auto (lars, global batch 1024): BN-free model: MLPerf lr 10" in r.stdout
    assert "recipe auto (lamb, global batch 1024): BN-free model: lr 0.025 x sqrt(1024/4096)" in r.stdout
    doc = json.load(open(tmp_path / "out" / "held_out.json"))
    assert [(s["name"], s["batch"]) for s in doc["summary"]] == [
        ("small batch SGD", 256), ("LAMB small batch recipe auto", 256), ("LARS 4x recipe auto", 1024),
        ("LAMB 4x recipe auto", 1024)]
    assert doc["summary"][0]["mean"] > 80           # the small-batch MLP learns the tabular data in 6 epochs
    assert all(len(row["curve"]) == 6 for row in doc["rows"])
    assert "tabular   LARS 4x recipe auto" in r.stdout
    assert "recipe auto (lamb, global batch 256): BN-free model: lr 0.025 x sqrt(256/4096)" in r.stdout
    assert "tabular   LAMB 4x recipe auto against LAMB small batch recipe auto (batch 256): " in r.stdout
