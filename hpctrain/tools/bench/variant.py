"""One training run of a study variant: the base config with a variant's overrides, trained in
its own run directory, reduced to the row the studies tabulate (``study large-batch`` and
``study held-out`` both train through it)."""
from __future__ import annotations

import copy
import json
import os

from hpctrain.job.config import Config, set_value


def with_values(base: Config, values: dict) -> Config:
    """A copy of ``base`` with ``values`` (``section.key`` -> value) set: the base stays as given
    for the next variant."""
    cfg = copy.deepcopy(base)
    for key, value in values.items():
        set_value(cfg, key, value)
    return cfg


def run_variant(base: Config, name: str, overrides: dict, out_dir: str, comm) -> dict:
    """Train ``base`` with ``overrides`` in ``out_dir``/<the variant's short name>; its summary and
    test-accuracy curve (read back from the run's metrics on rank 0)."""
    from hpctrain.job import run  # the training job is loaded only when a study trains
    run_dir = os.path.join(out_dir, name.split(")")[0].strip("(").replace(" ", "_") or name)
    cfg = with_values(base, {**overrides, "run.run_dir": run_dir, "run.progress": False, "train.eval_every": 1})
    summary = run(cfg, comm)
    curve = []
    if comm.Get_rank() == 0:
        with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
            curve = [r["test_accuracy"] for r in map(json.loads, fh) if r["event"] == "epoch"]
    return {"name": name, "overrides": overrides, "test_accuracy": summary["test_accuracy"],
            "test_loss": summary["test_loss"], "train_loss": summary["train_loss"],
            "num_classes": summary["num_classes"],
            "test_accuracy_before_polish": summary.get("test_accuracy_before_polish"),
            "global_batch": summary["global_batch"], "steps": summary["steps"], "curve": curve}
