"""``study held-out``'s accounting (no training): every seed is reported, a seed at chance is
marked collapsed and never averaged, and it misses the goal whatever the other seeds did."""
import math

import pytest

from hpctrain.tools.bench import held_out, study
from hpctrain.job.config import Config
from hpctrain.errors import TrainingCollapsed
from hpctrain.update import NonFiniteError

SGD, LAMB = "small batch SGD", "LAMB 32x recipe auto"


def finished(name, acc, loss, batch=64):
    return {"name": name, "overrides": {"train.batch_size": batch}, "test_accuracy": acc, "test_loss": loss,
            "num_classes": 10, "global_batch": batch, "steps": 100, "curve": []}


@pytest.fixture
def rows(monkeypatch):
    """The issue's signal1d table, run through run_one: seed 1 trains, seed 0 is stopped by the
    collapse check, seed 2 finishes at chance (test loss ln 10)."""
    outcomes = {(SGD, 0): finished(SGD, 0.9866, 0.05), (SGD, 1): finished(SGD, 0.9883, 0.05),
                (SGD, 2): finished(SGD, 0.9869, 0.05),
                (LAMB, 0): TrainingCollapsed("training collapsed: ..."),
                (LAMB, 1): finished(LAMB, 0.9508, 0.2, 2048),
                (LAMB, 2): finished(LAMB, 0.0947, math.log(10), 2048)}

    def fake_run_variant(cfg, name, overrides, out_dir, comm):
        got = outcomes[(name, cfg.train.seed)]
        if isinstance(got, Exception):
            raise got
        return dict(got)
    monkeypatch.setattr(study, "run_variant", fake_run_variant)
    return [held_out.run_one(Config(), "signal1d", seed, name, {"train.batch_size": 64 if name == SGD else 2048},
                             "unused", None)
            for name in (SGD, LAMB) for seed in range(3)]


def test_each_seed_is_reported_and_a_seed_at_chance_is_collapsed_not_averaged(rows):
    assert [r["failed"] for r in rows] == [None, None, None, "collapsed", None, "collapsed"]
    assert rows[3]["test_accuracy"] is None and "training collapsed" in rows[3]["error"]
    assert rows[5]["error"] == "test loss at chance"
    sgd, lamb = held_out.summarise(rows)
    assert sgd["accs"] == pytest.approx([98.66, 98.83, 98.69]) and sgd["n_failed"] == 0
    small = (98.66 + 98.83 + 98.69) / 3
    assert lamb["accs"] == [None, pytest.approx(95.08), None] and lamb["failed"] == ["collapsed", None, "collapsed"]
    assert lamb["n_failed"] == 2 and lamb["mean"] == pytest.approx(95.08)          # not (0 + 95.08 + 9.47) / 3
    assert lamb["vs_small"] == pytest.approx(95.08 - small) and lamb["min"] == lamb["max"] == pytest.approx(95.08)
    text = held_out.table([sgd, lamb])
    line = next(ln for ln in text.splitlines() if LAMB in ln)
    assert "collapsed 95.08 collapsed" in line and "goal missed (2 of 3 seeds collapsed)" in line
    assert "98.66 98.83 98.69" in text


def test_all_seeds_failed_prints_dashes_and_a_diverged_seed_is_named(rows):
    for r in rows[3:]:
        r["failed"] = "collapsed"
    rows[4]["failed"] = "diverged"
    lamb = held_out.summarise(rows)[1]
    assert lamb["mean"] is None and lamb["vs_small"] is None and lamb["min"] is None
    line = held_out.table([lamb])
    assert "collapsed diverged collapsed" in line and "goal missed (3 of 3 seeds collapsed/diverged)" in line


def test_a_diverged_run_is_a_row_not_a_crash(monkeypatch):
    def boom(*a):
        raise NonFiniteError("step 3: non-finite loss on rank 0")
    monkeypatch.setattr(study, "run_variant", boom)
    row = held_out.run_one(Config(), "tabular", 1, LAMB, {"train.batch_size": 2048}, "unused", None)
    assert row["failed"] == "diverged" and row["test_accuracy"] is None and row["seed"] == 1
