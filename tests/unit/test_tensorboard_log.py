"""The TensorBoard observer in process, read back with tensorboard's own reader: what the job's
records become, the loss scale, and a resumed leg's purge of the steps after its checkpoint."""
import pytest

from hpctrain.ops.metrics import MetricsLog
from hpctrain.ops.tensorboard import DIR_NAME, TensorBoardLog

pytest.importorskip("tensorboard")


def read(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / DIR_NAME))
    acc.Reload()
    return acc


def leg(run_dir, start_step, steps, epoch_rec=None, loss=1.0):
    log = MetricsLog(str(run_dir), enabled=True, append=start_step > 0)
    board = TensorBoardLog(str(run_dir), start_step)
    log.observers.append(board)
    log.log("config", config={"train": {"batch_size": 32}})
    for step in steps:
        log.observe("step", step=step, loss=loss + step, lr=0.1 * step)
    if epoch_rec:
        log.log("epoch", **epoch_rec)
    board.close()
    log.close()


def test_records_become_scalars(tmp_path):
    leg(tmp_path, 0, range(1, 5), {"epoch": 0, "step": 4, "train_loss": 0.5, "lr": 0.4, "epoch_s": 2.0,
                                   "phases_s": {"forward": 0.4, "allreduce": 0.2}, "data_wait_share": 0.25,
                                   "loss_scale": 1024.0})
    acc = read(tmp_path)
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(s, 1.0 + s) for s in range(1, 5)]
    assert [e.value for e in acc.Scalars("train/lr")] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert acc.Scalars("perf/samples_per_s")[0].value == pytest.approx(4 * 32 / 2.0)
    assert acc.Scalars("time_per_step_ms/forward")[0].value == pytest.approx(100.0)
    assert acc.Scalars("time_per_step_ms/allreduce")[0].value == pytest.approx(50.0)
    assert acc.Scalars("train/loss_scale")[0].value == 1024.0
    assert acc.Scalars("perf/data_wait_share")[0].value == pytest.approx(0.25)
    assert "test/accuracy" not in acc.Tags()["scalars"]       # not evaluated that epoch
    assert '"event": "step"' not in (tmp_path / "metrics.jsonl").read_text()   # per step: observers only


def test_a_resumed_leg_purges_the_steps_after_its_checkpoint(tmp_path):
    leg(tmp_path, 0, range(1, 7), loss=1.0)          # killed after step 6, its checkpoint at step 4
    leg(tmp_path, 4, range(5, 9), loss=10.0)         # resumed from step 4
    events = read(tmp_path).Scalars("train/loss")
    assert [e.step for e in events] == list(range(1, 9))
    assert [e.value for e in events] == [1.0 + s for s in range(1, 5)] + [10.0 + s for s in range(5, 9)]
