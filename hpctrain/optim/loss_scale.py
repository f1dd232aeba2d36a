"""Dynamic loss scaling for FP16 gradients with FP32 master weights.

Policy (Micikevicius et al., "Mixed Precision Training", arXiv:1710.03740; torch
``amp.GradScaler`` defaults): start at 2**16; on an overflow skip the step and halve the
scale (never below ``min_scale``); after ``growth_interval`` consecutive clean steps double
it (never above ``max_scale``).

``found_inf`` must already be agreed on every rank (the comm layer reduces the local flags
with a logical OR / MAX), so that every rank skips the same steps and keeps the same scale:
a rank-local decision would let replicas diverge. ``grads_have_inf`` is the local check (on
:func:`all_finite`, also the per-step weight check of :mod:`hpctrain.update.ssgd`);
``unscale_and_check_`` fuses unscaling with it (torch's
``_amp_foreach_non_finite_check_and_unscale_``, the kernel behind ``GradScaler``).

``MIN_SCALE``/``MAX_SCALE`` (1 and 2**24) bound every scale, and ``precision.init_scale`` and a
fixed ``precision.loss_scale`` are validated against the same range (``hpctrain.config``): a
scale up to 2**24 keeps ``loss * scale`` and the scaled fp32 gradients finite for any sane loss,
while 1e30 would turn an ordinary gradient of 1e9 into inf on every step.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["LossScaler", "next_scale", "all_finite", "finite_flag", "grads_have_inf", "unscale_and_check_",
           "MIN_SCALE", "MAX_SCALE"]

MIN_SCALE, MAX_SCALE = 1.0, 2.0 ** 24


def next_scale(scale: float, good_steps: int, found_inf: bool, *, growth_interval: int,
               growth_factor: float = 2.0, backoff_factor: float = 0.5,
               min_scale: float = MIN_SCALE, max_scale: float = MAX_SCALE) -> tuple[float, int]:
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
                 min_scale: float = MIN_SCALE, max_scale: float = MAX_SCALE):
        if not (growth_factor > 1.0 and 0.0 < backoff_factor < 1.0 and growth_interval >= 1
                and 0.0 < min_scale <= init_scale <= max_scale and math.isfinite(max_scale)):
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


@torch.no_grad()
def finite_flag(tensors: Iterable, fused: bool | None = None) -> torch.Tensor | None:
    """A 0-d bool tensor, on the tensors' device: do all ``tensors`` (None entries skipped) hold
    only finite values? Nothing is read back to the host (None: no elements at all).

    Each tensor's sum (fp32 accumulation for 16-bit tensors), then the sum of those: inf and NaN
    propagate through sums. On CPU this is the cheapest full pass measured: cheaper than
    ``_foreach_norm`` of any order and than ``isfinite().all()`` per tensor, which materialises a
    bool tensor (measurements: docs/environment.md). On a
    GPU (``fused``, the default for CUDA tensors) one reduction per tensor would be ~160 kernel
    launches for ResNet-50, so the multi-tensor ``torch._foreach_norm`` of order 1 in fp32 (a
    sum of absolute values: the same propagation, a few launches for all) replaces them. As in
    ``hpctrain.comm.fused.nonfinite``, finite values count as non-finite only if a sum exceeds
    fp32's 3.4e38 - weights of ~1e31 on average, a run that has diverged anyway.
    """
    tensors = [t for t in tensors if t is not None and t.numel()]
    if not tensors:
        return None
    if fused is None:
        fused = tensors[0].device.type == "cuda"
    if fused:       # 16-bit tensors accumulate in fp32 (one call per kind, at most two)
        narrow = [t for t in tensors if t.dtype in (torch.float16, torch.bfloat16)]
        wide = [t for t in tensors if t.dtype not in (torch.float16, torch.bfloat16)]
        sums = ([*torch._foreach_norm(narrow, 1, dtype=torch.float32)] if narrow else []) + \
               ([*torch._foreach_norm(wide, 1)] if wide else [])
    else:
        sums = [t.sum(dtype=torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t.sum()
                for t in tensors]
    # ``.to`` only where needed: a no-op ``.to`` still pays a dispatch per tensor (docs/communication.md)
    return torch.isfinite(torch.stack([s if s.dtype == torch.float32 else s.to(torch.float32) for s in sums]).sum())


def all_finite(tensors: Iterable, fused: bool | None = None) -> bool:
    """Do all ``tensors`` hold only finite values? :func:`finite_flag`, read once: one host
    sync in all."""
    flag = finite_flag(tensors, fused)
    return True if flag is None else bool(flag)


def grads_have_inf(params: Iterable) -> bool:
    """Local check: does any ``p.grad`` (parameters without a gradient are skipped) hold inf/NaN?

    One device-to-host transfer for all tensors (:func:`all_finite`).
    """
    return not all_finite(_grads(params))


def unscale_and_check_(params: Iterable, scale: float) -> bool:
    """Multiply every gradient by ``1/scale`` in place; return the local inf/NaN flag."""
    grads = _grads(params)
    if not grads:
        return False
    found = torch.zeros(1, dtype=torch.float32, device=grads[0].device)
    inv = torch.full((1,), 1.0 / scale, dtype=torch.float32, device=grads[0].device)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
    return bool(found.item())
