"""``study held-out``'s accounting (no training): every seed is reported, a seed at chance is
marked collapsed and never averaged, and it misses the goal whatever the other seeds did."""
import math

import pytest

from hpctrain.tools.bench import held_out, variant
from hpctrain.job.config import Config
from hpctrain.errors import TrainingCollapsed
from hpctrain.update import NonFiniteError

SGD, LAMB = "small batch SGD", "LAMB 32x recipe auto"


def finished(name, acc, loss, batch=64, test_loss=None):
    """A finished run's row: ``loss`` the last epoch's training loss (the test loss, unless given, too)."""
    return {"name": name, "overrides": {"train.batch_size": batch}, "test_accuracy": acc,
            "test_loss": loss if test_loss is None else test_loss, "train_loss": loss,
            "num_classes": 10, "global_batch": batch, "steps": 100, "curve": []}


@pytest.fixture
def rows(monkeypatch):
    """The issue's signal1d table, run through run_one: seed 1 trains, seed 0 is stopped by the
    collapse check, seed 2 finishes at chance (training loss ln 10). SGD's seed 2 overfits: its
    test loss is above ln 10, its accuracy and training loss are fine: not collapsed."""
    outcomes = {(SGD, 0): finished(SGD, 0.9866, 0.05), (SGD, 1): finished(SGD, 0.9883, 0.05),
                (SGD, 2): finished(SGD, 0.9869, 0.001, test_loss=2.6),
                (LAMB, 0): TrainingCollapsed("training collapsed: ..."),
                (LAMB, 1): finished(LAMB, 0.9508, 0.2, 2048),
                (LAMB, 2): finished(LAMB, 0.0947, math.log(10), 2048)}

    def fake_run_variant(cfg, name, overrides, out_dir, comm):
        got = outcomes[(name, cfg.train.seed)]
        if isinstance(got, Exception):
            raise got
        return dict(got)
    monkeypatch.setattr(variant, "run_variant", fake_run_variant)
    return [held_out.run_one(Config(), "signal1d", seed, name, {"train.batch_size": 64 if name == SGD else 2048},
                             "unused", None)
            for name in (SGD, LAMB) for seed in range(3)]


def test_each_seed_is_reported_and_a_seed_at_chance_is_collapsed_not_averaged(rows):
    assert [r["failed"] for r in rows] == [None, None, None, "collapsed", None, "collapsed"]
    assert rows[3]["test_accuracy"] is None and "training collapsed" in rows[3]["error"]
    assert rows[5]["error"] == "training loss at chance at the end"
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
    monkeypatch.setattr(variant, "run_variant", boom)
    row = held_out.run_one(Config(), "tabular", 1, LAMB, {"train.batch_size": 2048}, "unused", None)
    assert row["failed"] == "diverged" and row["test_accuracy"] is None and row["seed"] == 1


def test_small_lamb_adds_lamb_at_the_small_batch_and_says_what_the_large_batch_costs_it():
    names = [n for n, _ in held_out.variants(64, 32, 0.05, False, small_lamb=True)]
    assert names == [SGD, held_out.SMALL_LAMB, "LARS 32x recipe auto", LAMB]
    small_lamb = dict(held_out.variants(64, 32, 0.05, False, small_lamb=True))[held_out.SMALL_LAMB]
    assert small_lamb == {"train.batch_size": 64, "optim.weight_decay": 5e-5, "optim.recipe": "auto",
                          "optim.name": "lamb"}
    assert held_out.SMALL_LAMB not in dict(held_out.variants(64, 32, 0.05, False))
    rows = [{**finished(name, acc / 100, 0.3, batch), "dataset": "tabular", "seed": seed, "failed": None}
            for name, batch, accs in ((SGD, 64, (90.55, 90.84, 91.28)), (held_out.SMALL_LAMB, 64, (89.53, 89.92, 89.36)),
                                      (LAMB, 2048, (88.79, 89.23, 89.13)))
            for seed, acc in enumerate(accs)]
    summary = held_out.summarise(rows)
    assert summary[1]["vs_small"] == pytest.approx(89.60333 - 90.89, abs=1e-4)   # LAMB's own gap to SGD
    (line,) = held_out.large_against_small_lamb(summary)
    assert line == (f"tabular   {LAMB} against {held_out.SMALL_LAMB} (batch 64): "
                    f"{(88.79 + 89.23 + 89.13) / 3 - 89.60333:+.2f} mean, worst seed {88.79 - 89.60333:+.2f}")
    assert held_out.large_against_small_lamb(summary[:1] + summary[2:]) == []     # without the reference: none


def test_a_run_without_an_epoch_loss_is_not_called_collapsed(monkeypatch):
    """No epoch trained in this run (train_loss None, e.g. resumed at its end): judged by nothing, not a crash."""
    monkeypatch.setattr(variant, "run_variant", lambda *a: {**finished(LAMB, 0.9, None, 2048, test_loss=0.3)})
    row = held_out.run_one(Config(), "tabular", 0, LAMB, {"train.batch_size": 2048}, "unused", None)
    assert row["failed"] is None and row["error"] is None
