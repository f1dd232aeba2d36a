"""The progress bar reads the loss (a host sync on a GPU) only when it redraws (issue 34, N6)."""
import torch
from tqdm import tqdm

from hpctrain.job.console import show_progress


class CountedLoss:
    """A running loss sum whose host reads are counted."""

    def __init__(self):
        self.reads = 0

    def tolist(self):
        self.reads += 1
        return [1.5, 1.0]


def test_loss_read_only_on_redraws(tmp_path):
    loss = CountedLoss()
    with open(tmp_path / "bar", "w") as out:
        bar = tqdm(total=1000, file=out, mininterval=3600, miniters=1)   # redraws at the start only
        for n in range(1, 1001):
            show_progress(bar, loss, 0.1)
        bar.close()
    assert loss.reads <= 1


def test_loss_shown_when_it_redraws(tmp_path):
    loss = torch.tensor([6.0, 2.0])                # [sum of finite losses, their count]
    with open(tmp_path / "bar", "w") as out:
        bar = tqdm(total=4, file=out, mininterval=0, miniters=1)
        show_progress(bar, loss, 0.1)
        assert bar.postfix == "loss=3.000, lr=0.1"
        bar.close()
