"""What every update algorithm is: the shape :class:`hpctrain.trainer.DistributedTrainer` drives,
and the one place a mean gradient becomes an update or a skipped step.

An algorithm (:class:`UpdateAlgorithm`) owns what it made: the non-finite guard
(:mod:`hpctrain.update.guard`) and any hooks on the model, which :meth:`UpdateAlgorithm.close`
removes. It does not own the gradient sync it is given (the trainer closes that).
:meth:`UpdateAlgorithm.apply_mean` is the overflow / loss-scaler logic both SSGD and OD-SGD run
once the agreed mean is in ``p.grad``; they differ only in *when* that is (SSGD: this step;
OD-SGD: the step after) and in what they pass for the step it belongs to.
"""
from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from hpctrain.config.registries import Registry
from hpctrain.ops.metrics import NULL_TIMER, Timer
from hpctrain.update.guard import NonFiniteGuard, flag_needed, grad_sync_comm

# ``update.algorithm``: each algorithm's module registers its class (ssgd first: the default).
ALGORITHMS: Registry[type[UpdateAlgorithm]] = Registry("update.algorithm", "algorithm", sort_choices=False)


@dataclass
class StepResult:
    loss: torch.Tensor       # this rank's loss (detached, unscaled)
    skipped: bool = False    # the update was skipped (overflow)


def unscale_grads_(params, inv_scale: float) -> None:
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, inv_scale)


@contextlib.contextmanager
def group_lrs(optimizer: torch.optim.Optimizer, lrs: list[float] | None) -> Iterator[None]:
    """Run the optimiser at ``lrs`` (one per param group), then restore the current ones
    (None: as they are)."""
    if lrs is None:
        yield
        return
    now = [g["lr"] for g in optimizer.param_groups]
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr
    try:
        yield
    finally:
        for g, lr in zip(optimizer.param_groups, now):
            g["lr"] = lr


class UpdateAlgorithm(abc.ABC):
    """``step(compute_loss) -> StepResult`` updates the model from the mean gradient over the
    ranks of ``grad_sync``; ``finish()`` (collective) makes the state the same on every rank,
    as evaluation and checkpoints need; ``state_dict``/``load_state_dict`` carry the loss scaler
    and the step count; ``close()`` removes what the algorithm added to the model."""

    name = "base"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_sync, *,
                 scaler=None, timer: Timer = NULL_TIMER):
        self.model, self.optimizer, self.grad_sync = model, optimizer, grad_sync
        self.scaler, self.timer = scaler, timer
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.guard = NonFiniteGuard(grad_sync_comm(grad_sync)) if grad_sync is not None else None
        self.steps = 0              # the index of the next step (in NonFiniteError messages)
        self._hooks: list = []      # handles of hooks on the model, removed by close()

    @abc.abstractmethod
    def step(self, compute_loss: Callable[[], torch.Tensor]) -> StepResult:
        """One step; ``compute_loss`` runs the forward pass and returns the loss."""

    def grad_flag_needed(self) -> bool:
        """Must this step read the gradient sync's overflow flag (:func:`~hpctrain.update.guard.flag_needed`:
        a loss scaler, fp16 on the wire, or a weight check that is not lazy)?"""
        assert self.guard is not None
        lazy = self.guard.lazy
        if lazy is None:
            lazy = bool(self.params) and self.params[0].device.type != "cpu"
        return flag_needed(self.scaler, self.grad_sync, lazy)

    def apply_mean(self, step: int, overflow: bool, scale: float, loss: torch.Tensor,
                   own_grads_finite: Callable[[], bool], lrs: list[float] | None = None,
                   checked: bool = True) -> bool:
        """``p.grad`` holds the agreed mean of step ``step``'s gradients (backward ran at loss
        scale ``scale``; ``overflow``: the same on every rank). Update, or skip on every rank;
        returns skipped.

        With a loss scaler the scale advances (backs off on overflow) and an overflowed step is
        skipped; a good one is unscaled first. Without, an overflow goes to the guard, which
        raises :class:`~hpctrain.update.guard.NonFiniteError` or counts a wire skip
        (``own_grads_finite()``: this rank's own verdict, asked only then). The optimiser runs
        at ``lrs`` (those of ``step``; None: the current ones), then the weights are checked.
        ``checked`` False: ``overflow`` was not read (:meth:`grad_flag_needed`).
        """
        if self.scaler:
            self.scaler.update(overflow)
        if overflow:
            if not self.scaler:     # raises, or a finite-gradient wire overflow: skipped
                assert self.guard is not None       # apply_mean follows a grad_sync's mean
                self.guard.overflow(step, loss, own_grads_finite())
            return True
        if self.scaler:
            unscale_grads_(self.params, 1.0 / scale)
        with self.timer.span("optimizer"), group_lrs(self.optimizer, lrs):
            self.optimizer.step()
            assert self.guard is not None
            self.guard.applied(step, self.params, grads_checked=checked)
        return False

    def finish(self) -> None:
        """Check the last update's weights (a lazily read flag) before evaluating or saving."""
        if self.guard is not None:
            self.guard.settle()

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict() if self.scaler else None, "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.steps = int(state.get("steps", 0))

    def close(self) -> None:
        """Remove the hooks this algorithm put on the model (idempotent; not collective)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
