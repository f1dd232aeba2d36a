"""Scores of a batch of logits: what evaluation sums over a split (top-1, top-5, loss).

Sums, not means, so that ranks' shares combine exactly with one ``Allreduce(SUM)`` of
``(correct_top1, correct_top5, loss_sum, count)``.
"""
from __future__ import annotations

import torch

TOP_K = 5     # the second accuracy reported; only meaningful with more classes than this


def top_k_correct(logits: torch.Tensor, targets: torch.Tensor, k: int) -> int:
    """Samples whose target is among the ``k`` largest logits (ties: torch.topk's choice)."""
    k = min(k, logits.shape[1])
    return int((logits.topk(k, dim=1).indices == targets.view(-1, 1)).any(dim=1).sum())


def has_top_k(num_classes: int) -> bool:
    """Whether top-5 says anything: with 5 classes or fewer every sample is in its top 5."""
    return num_classes > TOP_K
