"""`--model package.module:factory --data DIR` trains a user's model on a user's shards."""
import json
import os

import numpy as np
import pytest

from hpctrain.data_tools.cli import main as data_tools
from tests.integration.inprocess import run_cli
from tests.integration.mpirun import mpirun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def seq_shards(tmp_path_factory):
    """1-D sequences (a shape no built-in model uses): class = which quarter holds the bump."""
    d = tmp_path_factory.mktemp("seq")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 800)
    x = rng.normal(0, 0.3, (800, 24)).astype(np.float32)
    for i, c in enumerate(y):
        x[i, c * 6:(c + 1) * 6] += 1.5
    np.savez(d / "seq.npz", x=x, y=y)
    assert data_tools(["convert", "--no-progress", "--from", "npz", str(d / "seq.npz"), "--out", str(d / "shards")]) == 0
    return str(d / "shards")


def train(n, shards, model, run_dir, *extra):
    return mpirun(n, ["-m", "hpctrain", "--model", model, "--data", shards, "--run-dir", str(run_dir),
                      "--no-progress", "--epochs", "4", "--batch-size", "32", *extra], timeout=120,
                  env={"PYTHONPATH": ROOT})[0]


def test_user_factory_trains(seq_shards, tmp_path):
    r = train(2, seq_shards, "tests.integration.fixtures.seqmodels:build", tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(open(tmp_path / "metrics.jsonl").readlines()[-1])
    assert summary["test_accuracy"] > 0.9, summary


@pytest.mark.parametrize("model,expect", [
    ("tests.integration.fixtures.nope:build", "cannot import 'tests.integration.fixtures.nope'"),
    ("tests.integration.fixtures.seqmodels:missing", "has no attribute 'missing'"),
    ("tests.integration.fixtures.seqmodels:not_a_module", "returned str, not a torch.nn.Module"),
    ("tests.integration.fixtures.seqmodels:wrong_classes", "but the data has 4 classes"),
])
def test_factory_errors_are_one_line(seq_shards, tmp_path, capsys, model, expect):
    r = run_cli(capsys, "--model", model, "--data", seq_shards, "--run-dir", str(tmp_path), "--no-progress")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], r.stderr
