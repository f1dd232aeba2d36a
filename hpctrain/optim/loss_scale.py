"""Dynamic loss scaling for FP16 gradients with FP32 master weights.

Policy (Micikevicius et al., "Mixed Precision Training", arXiv:1710.03740; torch
``amp.GradScaler`` defaults): start at 2**16; on an overflow skip the step and halve the
scale (never below ``min_scale``); after ``growth_interval`` consecutive clean steps double
it (never above ``max_scale``).

``found_inf`` must already be agreed on every rank (the comm layer reduces the local flags
with a logical OR / MAX), so that every rank skips the same steps and keeps the same scale:
a rank-local decision would let replicas diverge. ``grads_have_inf`` is the local check;
``unscale_and_check_`` fuses unscaling with it (torch's
``_amp_foreach_non_finite_check_and_unscale_``, the kernel behind ``GradScaler``).
"""
from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["LossScaler", "next_scale", "grads_have_inf", "unscale_and_check_"]


def next_scale(scale: float, good_steps: int, found_inf: bool, *, growth_interval: int,
               growth_factor: float = 2.0, backoff_factor: float = 0.5,
               min_scale: float = 1.0, max_scale: float = 2.0 ** 24) -> tuple[float, int]:
    """Pure update: ``(scale, good_steps)`` after one step with the agreed ``found_inf``."""
    if found_inf:
        return max(scale * backoff_factor, min_scale), 0
    good_steps += 1
    if good_steps >= growth_interval:
        return min(scale * growth_factor, max_scale), 0
    return scale, good_steps


class LossScaler:
    """State of the dynamic loss scaler; ``update`` applies ``next_scale``."""
    __slots__ = (
        # policy
        "growth_interval", "growth_factor", "backoff_factor", "min_scale", "max_scale",
        # state
        "scale", "good_steps", "n_skipped",
    )

    def __init__(self, init_scale: float = 2.0 ** 16, growth_interval: int = 2000,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 min_scale: float = 1.0, max_scale: float = 2.0 ** 24):
        if not (growth_factor > 1.0 and 0.0 < backoff_factor < 1.0 and growth_interval >= 1
                and 0.0 < min_scale <= init_scale <= max_scale):
            raise ValueError(
                f"LossScaler: need growth_factor > 1, 0 < backoff_factor < 1, "
                f"growth_interval >= 1, 0 < min_scale <= init_scale <= max_scale "
                f"(got {growth_factor}, {backoff_factor}, {growth_interval}, "
                f"{min_scale}, {init_scale}, {max_scale})")
        self.growth_interval = growth_interval
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.min_scale = min_scale
        self.max_scale = max_scale
        self.scale = float(init_scale)
        self.good_steps = 0
        self.n_skipped = 0

    def update(self, found_inf: bool) -> bool:
        """Advance after one step; return True if the optimiser step should be applied."""
        self.scale, self.good_steps = next_scale(
            self.scale, self.good_steps, bool(found_inf),
            growth_interval=self.growth_interval, growth_factor=self.growth_factor,
            backoff_factor=self.backoff_factor, min_scale=self.min_scale,
            max_scale=self.max_scale)
        if found_inf:
            self.n_skipped += 1
        return not found_inf

    def state_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    def load_state_dict(self, state: dict) -> None:
        for name in self.__slots__:
            if name in state:
                setattr(self, name, type(getattr(self, name))(state[name]))

    def __repr__(self) -> str:
        return (f"LossScaler(scale={self.scale}, good_steps={self.good_steps}, "
                f"n_skipped={self.n_skipped})")


def _grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]


def grads_have_inf(params: Iterable) -> bool:
    """Local check: does any ``p.grad`` (parameters without a gradient are skipped) hold inf/NaN?

    One device-to-host transfer for all tensors (a stacked ``isfinite().all()``).
    """
    grads = _grads(params)
    if not grads:
        return False
    return not bool(torch.stack([g.isfinite().all() for g in grads]).all())


def unscale_and_check_(params: Iterable, scale: float) -> bool:
    """Multiply every gradient by ``1/scale`` in place; return the local inf/NaN flag."""
    grads = _grads(params)
    if not grads:
        return False
    found = torch.zeros(1, dtype=torch.float32, device=grads[0].device)
    inv = torch.full((1,), 1.0 / scale, dtype=torch.float32, device=grads[0].device)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
    return bool(found.item())
