"""Evaluation totals kept on the model's device and read once (:class:`Scores`).

Reading a loss sum and a correct count per batch (``float(...)``) made the host wait for the
device twice per batch, so the next batch's copy and forward could not be queued behind the
current one. Here every total, and the index of the first sample whose loss is not finite
(:data:`hpctrain.ops.finite.NO_SAMPLE` if none), stays a 0-d tensor on the device, and
:meth:`Scores.read` copies them to the host in one go at the end.
"""
from __future__ import annotations

import torch

from hpctrain.ops.finite import NO_SAMPLE


class Scores:
    """Correct predictions, the sum of per-sample losses (fp32 batch sums added in float64, as
    before) and the first non-finite sample, on ``device``; ``count`` and ``pos`` on the host
    (batch sizes are known there)."""

    __slots__ = ("correct", "loss_sum", "first_bad", "count", "pos")

    def __init__(self, device, first_index: int):
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.first_bad = torch.full((), NO_SAMPLE, dtype=torch.int64, device=device)
        self.count, self.pos = 0, first_index

    def add(self, out: torch.Tensor, y: torch.Tensor) -> None:
        """One batch: logits ``out``, labels ``y``. Queues device work only."""
        losses = torch.nn.functional.cross_entropy(out, y, reduction="none")
        self.loss_sum += losses.sum().double()
        self.correct += (out.argmax(1) == y).sum()
        index = torch.arange(self.pos, self.pos + len(y), device=losses.device)
        first = torch.where(torch.isfinite(losses), NO_SAMPLE, index).min()
        self.first_bad = torch.minimum(self.first_bad, first)
        self.count += len(y)
        self.pos += len(y)

    def read(self) -> tuple[float, float, float, int]:
        """``(correct, loss_sum, count, first_bad)`` on the host: one copy from the device."""
        host = torch.stack([self.correct.double(), self.loss_sum, self.first_bad.double()]).cpu()
        correct, loss_sum, first_bad = host.tolist()
        return correct, loss_sum, float(self.count), int(first_bad)
