"""Synchronous SGD: backward, the mean of the gradients over ranks, one optimiser step.

With a loss scaler (mixed precision), the loss is multiplied by the scale before backward, the
averaged gradients are unscaled, and a step whose gradients overflowed (the flag the gradient
sync returns is identical on every rank, since all ranks hold the same reduced values) is
skipped everywhere while the scale backs off — weights never become inf/NaN.

Non-finite numbers stop a run rather than let it train on NaN, the same way for every algorithm
(:mod:`hpctrain.update.guard`); the overflow and loss-scaler decision is
:meth:`hpctrain.update.base.UpdateAlgorithm.apply_mean`, shared with OD-SGD.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from hpctrain.optim.loss_scale import all_finite
from hpctrain.update.base import ALGORITHMS, StepResult, UpdateAlgorithm, unscale_grads_

# re-exported: where they were defined before hpctrain.update.guard / hpctrain.update.base
from hpctrain.update.guard import MAX_WIRE_SKIPS, NonFiniteError, NonFiniteGuard, agreed_overflow, grad_sync_comm

__all__ = ["SSGD", "StepResult", "NonFiniteError", "NonFiniteGuard", "MAX_WIRE_SKIPS", "agreed_overflow",
           "grad_sync_comm", "unscale_grads_"]


@ALGORITHMS.register("ssgd")
class SSGD(UpdateAlgorithm):
    def step(self, compute_loss: Callable[[], torch.Tensor]) -> StepResult:
        """One synchronous step; ``compute_loss`` runs the forward pass and returns the loss."""
        step, self.steps = self.steps, self.steps + 1
        self.optimizer.zero_grad(set_to_none=False)
        with self.timer.span("forward"):
            loss = compute_loss()
        with self.timer.span("backward"):
            (loss * self.scaler.scale if self.scaler else loss).backward()
        check = self.grad_flag_needed() if self.guard is not None else True
        with self.timer.span("allreduce"):      # starts the round; p.grad: still this rank's own
            overflow = bool(self.grad_sync.finish(scatter=False, check=check))
        if self.guard is not None:
            self.guard.poll()       # the last update's weight flag, where reading costs no stall
            if not overflow:
                self.grad_sync.scatter_means()                      # p.grad: views of the means
        scale = self.scaler.scale if self.scaler else 1.0
        # on overflow p.grad still holds this rank's own gradients: its verdict for the guard
        skipped = self.apply_mean(step, overflow, scale, loss.detach(),
                                  lambda: all_finite(p.grad for p in self.params), checked=check)
        return StepResult(loss.detach(), skipped=skipped)
