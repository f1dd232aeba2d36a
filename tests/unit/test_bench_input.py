"""``bench input``'s arithmetic, its GIL check and its rounds' cleanup (the timed rows need minutes: run the bench)."""
import time

from hpctrain.tools.bench import input as bench


def test_gil_check_tells_a_releasing_call_from_a_holding_one():
    assert bench.gil_ticks(lambda i: sum(range(20_000)), n=10, interval_s=0.3) == 0
    assert bench.gil_ticks(lambda i: time.sleep(0.005), n=10, interval_s=0.3) > 0


def test_ratios_are_medians_of_per_round_ratios():
    got = {("hpctrain", 1): [(100, 0.5), (90, 0.5), (120, 0.5)],
           ("DataLoader", 1): [(50, 0.1), (60, 0.1), (40, 0.1)],
           ("hpctrain", 2): [(180, 0.9), (200, 1.0), (150, 0.9)],
           ("DataLoader", 2): [(100, 0.1), (100, 0.1), (100, 0.1)]}
    rows = {(r["contender"], r["workers"]): r for r in bench.rows_of(got, None)}
    assert rows[("hpctrain", 1)]["x_dataloader"] == 2.0            # 2.0, 1.5, 3.0
    assert rows[("hpctrain", 2)]["x_one_worker"] == 1.8            # 1.8, 2.22, 1.25
    assert rows[("hpctrain", 2)]["x_dataloader"] == 1.8 and rows[("hpctrain", 1)]["img_per_cpu_s"] == 200
    table = bench.format_table(list(rows.values()), 2600)
    assert "| hpctrain | 2 | 180 | 1.80 | 1.80 |" in table


def test_each_round_closes_its_shard_files(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from hpctrain.tools.bench.input import contenders
    from hpctrain.tools.bench.input_data import photos
    from hpctrain.data.shards import ShardSet
    from tests.unit.test_data_jpeg_loader import write_jpeg_shards
    blobs = photos(12, seed=1, size=(40, 48))
    d = write_jpeg_shards(tmp_path, blobs)
    opened, closed = [], []
    real_init, real_close = ShardSet.__init__, ShardSet.close
    monkeypatch.setattr(ShardSet, "__init__", lambda self, *a, **k: (opened.append(self), real_init(self, *a, **k))[1])
    monkeypatch.setattr(ShardSet, "close", lambda self: (closed.append(self), real_close(self))[1])
    rounds = contenders(SimpleNamespace(workers=[1], batch=4, batches=1, size=32), d, blobs)
    rounds[("hpctrain", 1)]()
    assert len(opened) == 1 and closed[:1] == opened
