"""No non-finite result is reported as done.

The per-step guard (:mod:`hpctrain.update.guard`) stops a run whose loss or gradient is
non-finite while it trains, unless a loss scaler skips the step. What it cannot see: a test split
holding a NaN or inf sample (data converted with ``--allow-nonfinite``) gives a NaN test loss
with every weight finite. A step a loss scaler skipped may have a non-finite loss; such steps are
left out of the epoch's mean training loss (:func:`add_step_loss`), which is non-finite only when
every step of the epoch was (:func:`epoch_loss`). Such a number must not end a run "done" with status 0: the job stops
with :class:`NonFiniteResult` (status 2, the status of a non-finite step; ``state.json`` says
``failed`` with the same line, so ``hpctrain status`` agrees), naming the split, the metric and,
where known, the first sample whose loss is non-finite. The checkpoint of the work is written
first (the weights are not what is wrong when the data is).
"""
from __future__ import annotations

import math

import torch

from hpctrain.errors import UserError

NO_SAMPLE = 1 << 62        # "no non-finite sample" in the MIN allreduce of first indices


class NonFiniteResult(UserError):
    """A metric the run would report is NaN or infinite (every rank raises it together)."""


def add_step_loss(acc: torch.Tensor, loss: torch.Tensor) -> None:
    """Add one step's loss to ``acc`` = [sum of the finite step losses, their count], on the
    loss's device (no host sync)."""
    finite = torch.isfinite(loss)
    acc += torch.stack((torch.where(finite, loss.to(acc.dtype), 0.0), finite.to(acc.dtype)))


def epoch_loss(loss_sum: float, n_finite: float, n_steps: float) -> float:
    """The mean training loss of an epoch over the steps whose loss was finite (summed over the
    ranks); NaN when there were steps and none was finite; 0 for an epoch with no step here."""
    if n_finite:
        return loss_sum / n_finite
    return math.nan if n_steps else 0.0


def first_nonfinite(per_sample_loss: torch.Tensor, first_index: int) -> int:
    """The global index of the first sample of a batch whose loss is not finite (the batch's
    first sample is ``first_index``), or :data:`NO_SAMPLE`."""
    bad = torch.nonzero(~torch.isfinite(per_sample_loss))
    return first_index + int(bad[0, 0]) if len(bad) else NO_SAMPLE


def check_result(record: dict, split: str, keys: tuple[str, ...], where: str = "",
                 sample: int = NO_SAMPLE) -> None:
    """Raise :class:`NonFiniteResult` if any of ``record[keys]`` is not finite. ``where`` says
    when (``"after epoch 3"``); ``sample`` names the first bad sample of ``split`` if known."""
    bad = [k for k in keys if k in record and not math.isfinite(float(record[k]))]
    if not bad:
        return
    what = ", ".join(f"{k} {record[k]}" for k in bad)
    at = (f": sample {sample} of the {split} split has a non-finite loss (its data or label)"
          if sample != NO_SAMPLE else "")
    raise NonFiniteResult(f"non-finite result on the {split} split{' ' + where if where else ''} ({what}){at}; "
                          f"not reported as done (a checkpoint of the weights was written)")
