"""TensorBoard event files of a run (``report.tensorboard = true``): rank 0 writes them to
``RUN_DIR/tensorboard`` with torch's ``SummaryWriter`` (the ``tensorboard`` package, an optional
dependency).

An observer of the run's :class:`~hpctrain.ops.metrics.MetricsLog`: it turns the records the job
logs anyway into scalars, so the training loop knows nothing of it. Per step (the ``step``
records the loop hands observers, never written to ``metrics.jsonl``): ``train/loss`` and
``train/lr``. Per epoch: ``train/epoch_loss``, ``test/accuracy`` (``test/top5_accuracy``,
``test/loss``) where evaluated, ``perf/samples_per_s``, ``perf/data_wait_share``,
``train/loss_scale`` with a loss scaler, and the per-step time budget ``time_per_step_ms/<phase>``
(each phase's time over the epoch's steps, as the step timer measured it). The summary's final
test figures come at the last step. A resumed run purges events after the step it resumed from,
so a leg killed before its checkpoint leaves no doubled curve.
"""
from __future__ import annotations

import importlib.util
import os

MISSING = ("report.tensorboard needs the tensorboard package: pip install 'hpctrain[tensorboard]' "
           "(or pip install tensorboard)")
DIR_NAME = "tensorboard"


def tensorboard_missing() -> str | None:
    """The one line to print when ``tensorboard`` cannot be imported, else None."""
    return MISSING if importlib.util.find_spec("tensorboard") is None else None


class TensorBoardLog:
    """Writes the scalars of the records it is given (:meth:`record`) to ``run_dir/tensorboard``."""

    def __init__(self, run_dir: str, start_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter
        # a step's scalars are numbered by the steps done after it: the checkpoint's own stay
        self.writer = SummaryWriter(log_dir=os.path.join(run_dir, DIR_NAME),
                                    purge_step=start_step + 1 if start_step else None)
        self.global_batch = 0
        self.last_step = start_step

    def record(self, rec: dict) -> None:
        event = rec.get("event")
        if event == "config":
            self.global_batch = int(rec.get("config", {}).get("train", {}).get("batch_size", 0))
        elif event == "step":
            self.writer.add_scalar("train/loss", float(rec["loss"]), rec["step"])
            self.writer.add_scalar("train/lr", float(rec["lr"]), rec["step"])
        elif event == "epoch":
            self._epoch(rec)
        elif event == "summary":
            step = rec["steps"]
            for key, tag in (("test_accuracy", "test/accuracy"), ("test_top5_accuracy", "test/top5_accuracy"),
                             ("test_loss", "test/loss")):
                if key in rec:
                    self.writer.add_scalar(tag, rec[key], step)
            self.writer.flush()

    def _epoch(self, rec: dict) -> None:
        step, steps = rec["step"], rec["step"] - self.last_step
        self.last_step = step
        scalars = {"train/epoch_loss": rec.get("train_loss"), "test/accuracy": rec.get("test_accuracy"),
                   "test/top5_accuracy": rec.get("test_top5_accuracy"), "test/loss": rec.get("test_loss"),
                   "perf/data_wait_share": rec.get("data_wait_share"), "train/loss_scale": rec.get("loss_scale")}
        if steps > 0 and rec.get("epoch_s"):
            scalars["perf/samples_per_s"] = steps * self.global_batch / rec["epoch_s"]
            for phase, seconds in (rec.get("phases_s") or {}).items():
                scalars[f"time_per_step_ms/{phase}"] = 1000.0 * seconds / steps
        for tag, value in scalars.items():
            if value is not None:
                self.writer.add_scalar(tag, float(value), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def observe(log, enabled: bool, run_dir: str, start_step: int, stack) -> None:
    """Rank 0 of a run with ``report.tensorboard``: a :class:`TensorBoardLog` observing ``log``
    (a :class:`~hpctrain.ops.metrics.MetricsLog`; enabled on rank 0 alone), closed by ``stack``."""
    if enabled and log.enabled:
        board = TensorBoardLog(run_dir, start_step)
        stack.callback(board.close)
        log.observers.append(board)
