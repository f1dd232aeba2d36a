"""The job's GPU data path on the CPU: raw batches normalised and augmented after the copy.

``HPCTRAIN_TEST_DEVICE_BATCHES=1`` makes the CPU job take the path a GPU job takes (the loader
hands over raw uint8 batches; training, evaluation and Final Polishing prepare them through
``device_batches``). The batches are bit-identical to the loader's own, so the whole run must be:
every logged loss, the accuracies and the polished BN statistics' effect, with no tolerance.
"""
import json

import pytest

from hpctrain.ops.testhooks import TEST_DEVICE_BATCHES
from tests.integration.mpirun import mpirun

ARGS = ["--no-progress", "--epochs", "4", "--set", "data.augment=true", "--set", "data.augment_flip=false",
        "--set", "polish.bn_recompute=true", "--set", "polish.unaugmented_epochs=1", "--set", "train.eval_every=2"]


def records(run_dir):
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


@pytest.mark.slow
def test_job_on_raw_batches_equals_job_on_loader_batches(tmp_path):
    runs = {}
    for switch in ("0", "1"):
        run_dir = tmp_path / f"raw{switch}"
        r, _ = mpirun(2, ["-m", "hpctrain", "--run-dir", str(run_dir), *ARGS], env={TEST_DEVICE_BATCHES: switch})
        assert r.returncode == 0, r.stderr[-2000:]
        runs[switch] = records(run_dir)
    config = runs["1"][0]
    assert "normalised on the device" in config["data"] and "normalised on the device" not in runs["0"][0]["data"]
    keys = ("train_loss", "test_accuracy", "test_loss", "test_accuracy_before_polish")
    for want, got in zip(runs["0"][1:], runs["1"][1:], strict=True):
        assert {k: want.get(k) for k in keys} == {k: got.get(k) for k in keys}
    assert runs["1"][-1]["event"] == "summary" and "test_accuracy_before_polish" in runs["1"][-1]
