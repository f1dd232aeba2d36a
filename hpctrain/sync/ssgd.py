"""Synchronous SGD: backward, the mean of the gradients over ranks, one optimiser step.

With a loss scaler (mixed precision), the loss is multiplied by the scale before backward, the
averaged gradients are unscaled, and a step whose gradients overflowed (the flag the gradient
sync returns is identical on every rank, since all ranks hold the same reduced values) is
skipped everywhere while the scale backs off — weights never become inf/NaN.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from hpctrain.metrics import NULL_TIMER, StepTimer


@dataclass
class StepResult:
    loss: torch.Tensor       # this rank's loss (detached, unscaled)
    skipped: bool = False    # the update was skipped (overflow)


def unscale_grads_(params, inv_scale: float) -> None:
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, inv_scale)


def agreed_overflow(sync_flag, params) -> bool:
    """The overflow decision: the sync's flag, or a check of the (identical) reduced gradients."""
    if sync_flag is not None:
        return bool(sync_flag)
    grads = [p.grad for p in params if p.grad is not None]
    return bool(grads) and not bool(torch.stack([g.isfinite().all() for g in grads]).all())


class SSGD:
    name = "ssgd"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_sync, *,
                 scaler=None, timer: StepTimer = NULL_TIMER):
        self.model, self.optimizer, self.sync = model, optimizer, grad_sync
        self.scaler, self.timer = scaler, timer
        self.params = [p for p in model.parameters() if p.requires_grad]

    def step(self, compute_loss: Callable[[], torch.Tensor]) -> StepResult:
        """One synchronous step; ``compute_loss`` runs the forward pass and returns the loss."""
        self.optimizer.zero_grad(set_to_none=False)
        with self.timer.span("forward"):
            loss = compute_loss()
        with self.timer.span("backward"):
            (loss * self.scaler.scale if self.scaler else loss).backward()
        with self.timer.span("allreduce"):
            flag = self.sync.allreduce_grads()
        if self.scaler:
            overflow = agreed_overflow(flag, self.params)
            scale = self.scaler.scale
            self.scaler.update(overflow)
            if overflow:
                return StepResult(loss.detach(), skipped=True)
            unscale_grads_(self.params, 1.0 / scale)
        with self.timer.span("optimizer"):
            self.optimizer.step()
        return StepResult(loss.detach())

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict() if self.scaler else None}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
