"""What evaluation sums over a split: top-1, top-5, loss, and the first sample whose loss is not
finite, kept on the model's device (:class:`Scores`) and read once at the end.

Sums, not means, so that ranks' shares combine exactly with one ``Allreduce(SUM)``. Reading a
total per batch (``float(...)``) made the host wait for the device every batch, so the next
batch's copy and forward could not be queued behind the current one: here every total is a 0-d
tensor on the device and :meth:`Scores.read` copies them to the host in one go.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from hpctrain.ops.finite import NO_SAMPLE

TOP_K = 5     # the second accuracy reported; only meaningful with more classes than this


def top_k_hits(logits: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """Samples whose target is among the ``k`` largest logits (ties: torch.topk's choice), as a
    0-d tensor on the logits' device."""
    k = min(k, logits.shape[1])
    return (logits.topk(k, dim=1).indices == targets.view(-1, 1)).any(dim=1).sum()


def has_top_k(num_classes: int) -> bool:
    """Whether top-5 says anything: with 5 classes or fewer every sample is in its top 5."""
    return num_classes > TOP_K


class Totals(NamedTuple):
    """One rank's sums, on the host (``first_bad``: :data:`~hpctrain.ops.finite.NO_SAMPLE` if none)."""

    correct: float
    top_k: float
    loss_sum: float
    samples: float
    first_bad: int


class Scores:
    """Correct predictions (top-1 and top-``TOP_K``), the sum of per-sample losses (fp32 batch
    sums added in float64) and the first non-finite sample, on ``device``; ``count`` and ``pos``
    on the host (batch sizes are known there). ``first_index``: the global position of this
    rank's first sample."""

    __slots__ = ("correct", "top_k", "loss_sum", "first_bad", "count", "pos")

    def __init__(self, device, first_index: int = 0):
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.top_k = torch.zeros((), dtype=torch.int64, device=device)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.first_bad = torch.full((), NO_SAMPLE, dtype=torch.int64, device=device)
        self.count, self.pos = 0, first_index

    def add(self, out: torch.Tensor, y: torch.Tensor) -> None:
        """One batch: logits ``out``, labels ``y``. Queues device work only."""
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none")
        self.loss_sum += losses.sum().double()
        self.correct += (out.argmax(1) == y).sum()
        self.top_k += top_k_hits(out, y, TOP_K)
        index = torch.arange(self.pos, self.pos + len(y), device=losses.device)
        first = torch.where(torch.isfinite(losses), NO_SAMPLE, index).min()
        self.first_bad = torch.minimum(self.first_bad, first)
        self.count += len(y)
        self.pos += len(y)

    def read(self) -> Totals:
        """This rank's totals on the host: one copy from the device."""
        host = torch.stack([self.correct.double(), self.top_k.double(), self.loss_sum,
                            self.first_bad.double()]).cpu()
        correct, top_k, loss_sum, first_bad = host.tolist()
        return Totals(correct, top_k, loss_sum, float(self.count), int(first_bad))
