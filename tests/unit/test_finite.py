"""A non-finite result is never reported as done (issue 37, item 3): the check and its line."""
import math

import pytest
import torch

from hpctrain.ops.finite import NO_SAMPLE, NonFiniteResult, check_result, first_nonfinite


def test_first_nonfinite_sample_counts_from_the_batch_start():
    losses = torch.tensor([0.5, 1.0, math.nan, math.inf, 0.1])
    assert first_nonfinite(losses, 100) == 102
    assert first_nonfinite(torch.tensor([0.5, 1.0]), 100) == NO_SAMPLE


def test_finite_results_pass_and_non_finite_ones_name_split_metric_and_sample():
    check_result({"test_loss": 0.3, "test_accuracy": 0.9}, "test", ("test_loss", "test_accuracy"))
    with pytest.raises(NonFiniteResult, match=r"^non-finite result on the test split in the final evaluation "
                                              r"\(test_loss nan\): sample 17 of the test split has a non-finite loss"):
        check_result({"test_loss": math.nan, "test_accuracy": 0.9}, "test", ("test_loss", "test_accuracy"),
                     "in the final evaluation", 17)
    with pytest.raises(NonFiniteResult, match=r"^non-finite result on the train split after epoch 2 "
                                              r"\(train_loss inf\); not reported as done"):
        check_result({"train_loss": math.inf}, "train", ("train_loss",), "after epoch 2")
    assert NonFiniteResult.agreed                # every rank raises it together: status 2, one line


def test_an_epochs_loss_leaves_out_the_steps_a_scaler_skipped():
    """A loss scaler skips a step whose loss overflowed: that step must not make the epoch's mean
    non-finite (which would end the run), only an epoch with no finite step does."""
    from hpctrain.ops.finite import add_step_loss, epoch_loss
    acc = torch.zeros(2)
    for loss in (2.0, math.inf, 4.0, math.nan):
        add_step_loss(acc, torch.tensor(loss))
    assert acc.tolist() == [6.0, 2.0]
    assert epoch_loss(*acc.tolist(), 4) == 3.0
    assert math.isnan(epoch_loss(0.0, 0.0, 3)) and epoch_loss(0.0, 0.0, 0) == 0.0
