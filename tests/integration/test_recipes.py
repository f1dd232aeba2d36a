"""examples/recipes/: every file is a config ``--config`` takes, names its source, what data it
expects and its launch line, and trains.

Each recipe is read as the CLI reads it (``config_from_args(["--config", FILE, "--set", ...])``),
validated at the rank count of its own launch line, then run in this process on one rank
(``MPI.COMM_SELF``) for two steps, with its evaluation and Final Polishing where it asks, on
synthetic shards with the data the recipes expect: 3 channels and 1000 classes (32x32 pixels
instead of 224x224 to keep it cheap: the ResNets pool adaptively). What one CPU rank cannot run
is overridden and listed in ``ON_ONE_CPU_RANK``; everything else is the file's own.
"""
import glob
import os
import re

import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.job.args import config_from_args
from hpctrain.data_tools.sources import from_arrays
from hpctrain.data_tools.writer import convert
from hpctrain.job import run
from hpctrain.job.config import validate

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
RECIPES = sorted(glob.glob(os.path.join(ROOT, "examples", "recipes", "*.toml")))
NAMES = [os.path.basename(p) for p in RECIPES]
CLASSES, SIDE, BATCH = 1000, 32, 8
ON_ONE_CPU_RANK = {
    "train.batch_size": BATCH,      # the recipes' global batches are for hundreds of ranks
    "train.max_steps": 2,
    "precision.compute": "fp32",    # fp16 compute needs a GPU (the loss scaler still runs)
    "polish.bn_batches": 2,
}


def launch_ranks(text: str) -> int:
    """The rank count of the recipe's own launch line (``mpiexec -n N``)."""
    found = re.search(r"mpiexec -n (\d+)", text)
    assert found, "no launch line"
    return int(found.group(1))


def test_there_are_the_six_headline_recipes():
    assert NAMES == ["final_polishing.toml", "goyal_imagenet_sgd.toml", "hierarchical_fp16.toml",
                     "lamb_imagenet.toml", "mlperf_lars_32k.toml", "odsgd.toml"]


@pytest.mark.parametrize("path", RECIPES, ids=NAMES)
def test_a_recipe_names_its_source_data_and_launch_and_validates_at_its_rank_count(path):
    with open(path) as fh:
        text = fh.read()
    for word in ("# Source:", "# Expects:", "# Ranks:"):
        assert word in text, f"{os.path.basename(path)} has no {word!r} line"
    assert f"--config examples/recipes/{os.path.basename(path)}" in text
    cfg = config_from_args(["--config", path])
    validate(cfg, launch_ranks(text))      # the global batch divides by the ranks it names, every range


@pytest.fixture(scope="module")
def imagenet_like(tmp_path_factory):
    """Shards of the recipes' data layout: uint8 3xHxW images, 1000 classes."""
    out = str(tmp_path_factory.mktemp("imagenet_like"))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (40, 3, SIDE, SIDE), dtype=np.uint8)
    y = rng.integers(0, CLASSES, 40)
    convert(from_arrays({"train": (x[:32], y[:32]), "test": (x[32:], y[32:])},
                        [f"c{i}" for i in range(CLASSES)], "synthetic"), out, 2)
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", RECIPES, ids=NAMES)
def test_a_recipe_trains_two_steps(path, imagenet_like, tmp_path):
    overrides = {**ON_ONE_CPU_RANK, "data.dataset": imagenet_like, "run.run_dir": str(tmp_path / "run"),
                 "run.progress": "false"}
    argv = ["--config", path] + [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    cfg = config_from_args(argv)
    validate(cfg, 1)
    summary = run(cfg, MPI.COMM_SELF)
    assert summary["steps"] == 2
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    if cfg.polish.bn_recompute:
        assert "test_accuracy_before_polish" in summary
