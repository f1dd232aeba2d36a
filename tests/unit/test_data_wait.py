"""Is input the bottleneck? The per-epoch shares, when the one warning comes, and the report's line.

Ranks are simulated by a fake communicator whose ``allgather`` returns every rank's row (the
other ranks' rows are given); the job itself is checked in tests/mpi/test_data_wait_job.py.
"""
import json

import pytest

from hpctrain.ops import report
from hpctrain.ops.datawait import MIN_WAIT_S, THRESHOLD, InputWatch


class Ranks:
    """``allgather`` as rank ``me`` of a world where the other ranks gathered ``others``."""

    def __init__(self, me=0, others=()):
        self.me, self.others = me, list(others)

    def allgather(self, row):
        rows = list(self.others)
        rows.insert(self.me, row)
        return rows


def watch(warmup_s, comm=None, min_wait_s=1.0):
    w = InputWatch(comm or Ranks(), min_wait_s=min_wait_s)
    w.warmup_s = warmup_s              # as batch_arrived() would have measured it
    return w


def test_the_warm_up_alone_does_not_warn_a_slow_loader_does_once():
    w = watch(warmup_s=5.0)
    # epoch 0: 6 s of 20 s waited, 5 s of them the first batch → 1/15 = 6.7 % so far: no warning
    fields, warning = w.epoch(0, data_s=6.0, epoch_s=20.0)
    assert fields == {"data_wait_share": pytest.approx(0.3), "data_wait_share_max": pytest.approx(0.3),
                      "data_wait_rank": 0}
    assert warning is None
    # epoch 1 waits 6 of 20 s again (no warm-up now): (1 + 6) / (15 + 20) = 20 % so far
    fields, warning = w.epoch(1, data_s=6.0, epoch_s=20.0)
    assert "rank 0 has waited for batches 20% of its training time so far (7 s by the end of epoch 1" in warning
    assert "data.workers" in warning and "data.decode" in warning
    assert w.epoch(2, data_s=10.0, epoch_s=20.0)[1] is None            # once
    assert w.epoch(3, data_s=10.0, epoch_s=20.0)[0]["data_wait_share"] == pytest.approx(0.5)   # still recorded


def test_a_loader_that_keeps_up_never_warns():
    w = watch(warmup_s=0.01)
    assert all(w.epoch(e, data_s=THRESHOLD * 20.0 * 0.99, epoch_s=20.0)[1] is None for e in range(20))


def test_a_share_over_the_threshold_waits_for_enough_seconds_to_matter():
    w = InputWatch(Ranks())                     # the default floor
    w.warmup_s = 0.0
    epochs = [w.epoch(e, data_s=0.5, epoch_s=2.0)[1] for e in range(int(MIN_WAIT_S / 0.5) + 1)]
    assert epochs[:-2] == [None] * (len(epochs) - 2)                   # 25 % of 2-second epochs: not yet
    assert epochs[-2] is not None and f"({MIN_WAIT_S:.0f} s by the end of epoch {len(epochs) - 2}" in epochs[-2]


def test_the_slowest_fed_rank_decides_and_is_named():
    # rank 0 (this one) hardly waits; rank 2 has waited 40 % of its run so far, rank 1 an epoch of 20 %
    w = watch(warmup_s=0.0, comm=Ranks(me=0, others=[(0.2, 2.0, 10.0), (0.4, 4.0, 10.0)]))
    fields, warning = w.epoch(0, data_s=0.1, epoch_s=10.0)
    assert fields == {"data_wait_share": pytest.approx(0.01), "data_wait_share_max": 0.4, "data_wait_rank": 2}
    assert warning.startswith("hpctrain: warning: input is the bottleneck: rank 2 has waited for batches 40%")


def test_batch_arrived_times_only_the_first_batch():
    w = InputWatch(Ranks())
    assert w.warmup_s is None
    w.batch_arrived()
    first = w.warmup_s
    w.batch_arrived()
    assert first is not None and first >= 0 and w.warmup_s == first


def test_report_gives_the_epochs_data_wait_and_the_warning(tmp_path):
    warning = watch(0.0).epoch(1, data_s=3.0, epoch_s=10.0)[1]
    recs = [{"event": "config", "config": {"train": {"batch_size": 8}}, "world_size": 2, "start_step": 0},
            {"event": "epoch", "epoch": 0, "step": 4, "epoch_s": 1.0, "phases_s": {"data": 0.2},
             "data_wait_share": 0.2, "data_wait_share_max": 0.25, "data_wait_rank": 1},
            {"event": "warning", "epoch": 1, "message": warning},
            {"event": "epoch", "epoch": 1, "step": 8, "epoch_s": 1.0, "phases_s": {"data": 0.3},
             "data_wait_share": 0.3, "data_wait_share_max": 0.35, "data_wait_rank": 0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    f = report.figures(report.load_run(str(tmp_path)))
    assert f["data_wait"] == {"mean": pytest.approx(0.3), "max": 0.35, "epoch": 1, "rank": 0, "warning": warning}
    text = report.format_report(f)
    assert "data wait per epoch     mean 30.0%, highest 35.0% (epoch 1, rank 0)" in text
    assert "input-bound             input is the bottleneck: rank 0 has waited" in text
    del recs[2]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert "input-bound" not in report.format_report(report.figures(report.load_run(str(tmp_path))))
