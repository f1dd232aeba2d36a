"""LAMB: layer-wise adaptive moments for large-batch training (You et al. 2019, "Large Batch
Optimization for Deep Learning: Training BERT in 76 minutes", arXiv:1904.00962, Algorithm 2).

For one parameter tensor ("layer") x with gradient g at step t = 1, 2, ...::

    m = b1*m + (1-b1)*g              v = b2*v + (1-b2)*g*g
    m_hat = m / (1 - b1**t)          v_hat = v / (1 - b2**t)          (bias correction)
    r = m_hat / (sqrt(v_hat) + eps) + wd*x                             (Adam direction + decoupled decay)
    ratio = |x| / |r|                (1 if |x| == 0 or |r| == 0; the paper's phi is the identity)
    x = x - lr * ratio * r

so every layer moves by ``lr * |x|`` per step, whatever its gradient scale: ``lr`` is a relative
step (typical peaks 1e-3..2e-2), not an SGD learning rate. Excluded parameters (``exclude_1d``:
biases, norm gamma/beta, as the BERT reference's ``exclude_from_layer_adaptation``) take the
plain Adam step ``lr * lr_1d_scale * m_hat/(sqrt(v_hat)+eps)`` without weight decay: per
coordinate at most about ``lr``, so the 1-D parameters of a BN-free net stay bounded (the LARS
pitfall in docs/large-batch.md does not arise). Gradients are not clipped or pre-normalised.

As ``optim.name = "lamb"`` (the end of this file): its options ``[optim.lamb]`` (``beta2``,
``eps``; beta1 is ``optim.momentum``) and its row of the large-batch recipe. Where lr or the
warm-up is unset it takes the generic values (:data:`~hpctrain.optim.schedules.GOYAL_UNSET`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated

import torch
from torch.optim import Optimizer

from hpctrain.config.plugins import check_options
from hpctrain.config.values import FRACTION, Option, Range

from .recipe import RECIPE_ROWS, Recipe
from .registry import OPTIMIZERS
from .schedules import mlperf_lars_warmup_epochs

__all__ = ["LAMB", "build", "recipe_row"]


# The one default of each LAMB option, for the class and for the config (build's annotations).
BETA2, EPS = 0.999, 1e-6


class LAMB(Optimizer):
    """LAMB (module docstring). Per-group options: lr, betas, eps, weight_decay, exclude_1d,
    lr_1d_scale. State per parameter: ``step``, ``exp_avg`` (m), ``exp_avg_sq`` (v)."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, BETA2), eps: float = EPS,
                 weight_decay: float = 0.0, exclude_1d: bool = True, lr_1d_scale: float = 1.0):
        b1, b2 = betas
        if lr < 0 or eps < 0 or weight_decay < 0 or lr_1d_scale < 0 or not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"LAMB: invalid hyper-parameter (lr={lr}, betas={betas}, eps={eps}, "
                             f"weight_decay={weight_decay}, lr_1d_scale={lr_1d_scale})")
        super().__init__(params, dict(lr=lr, betas=(b1, b2), eps=eps, weight_decay=weight_decay,
                                      exclude_1d=exclude_1d, lr_1d_scale=lr_1d_scale))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]  # torch's overloads split by closure
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("LAMB does not support sparse gradients")
                direction = self._adam_direction(p, p.grad, b1, b2, group["eps"])
                if group["exclude_1d"] and p.ndim <= 1:
                    p.add_(direction, alpha=-group["lr"] * group["lr_1d_scale"])
                    continue
                if group["weight_decay"]:
                    direction.add_(p, alpha=group["weight_decay"])
                w_norm, r_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(direction)
                ratio = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, torch.ones_like(w_norm))
                p.add_(direction * ratio, alpha=-group["lr"])     # ratio stays a tensor: no host sync
        return loss

    def _adam_direction(self, p, g, b1: float, b2: float, eps: float) -> torch.Tensor:
        """Update the moments and return ``m_hat / (sqrt(v_hat) + eps)`` (a new tensor)."""
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v / (1 - b2 ** t)).sqrt_().add_(eps)
        return (m / (1 - b1 ** t)).div_(denom)


# --- optim.name = "lamb" ---------------------------------------------------------------------------
# Its own options ([optim.lamb] in the config): type, help and range, read by hpctrain.config.plugins.
Beta2 = Annotated[float, Option("LAMB: second-moment decay (beta1 is optim.momentum)", FRACTION)]
Eps = Annotated[float, Option("LAMB: epsilon added to sqrt(v_hat)", Range(0, 1))]


@OPTIMIZERS.register("lamb")
def build(params, *, lr: float, momentum: float, weight_decay: float, exclude_1d: bool, lr_1d_scale: float,
          beta2: Beta2 = BETA2, eps: Eps = EPS, **_) -> LAMB:
    """LAMB with beta1 = ``momentum``; its own options checked by the rule the config applies
    (``[optim.lamb]``)."""
    check_options(build, "optim.lamb", locals())
    return LAMB(params, lr=lr, betas=(momentum, beta2), eps=eps,
                weight_decay=weight_decay, exclude_1d=exclude_1d, lr_1d_scale=lr_1d_scale)


BASE_LR, BASE_BATCH, MAX_LR = 0.05, 2048, 0.1           # square-root scaling from here (You et al. 2019)
# BN-free: about a third of the normalised row's relative step. At 0.0707 (batch 4096)
# LAMB's update points along the weights (cosine +0.3..0.9), every norm grows ~lr*cos per step
# until a layer's ReLUs are all dead and the loss sits at ln C; 0.025 trained (docs/large-batch.md).
# One seed per set, batch 2048-4096: the cap above 4096 is not measured.
BN_FREE_BASE_LR, BN_FREE_BASE_BATCH, BN_FREE_MAX_LR = 0.025, 4096, 0.05


def recipe_row(global_batch: int, normalised: bool) -> Recipe:
    """lr square-root scaled from 0.05 at batch 2048, capped at 0.1 (normalised), or from 0.025 at
    4096, capped at 0.05 (BN-free: its Adam direction points along the weights there, so the
    norms grow at about lr per step); MLPerf's warm-up epochs; poly."""
    kind = "normalised" if normalised else "BN-free"
    base, base_batch, cap = ((BASE_LR, BASE_BATCH, MAX_LR) if normalised else
                             (BN_FREE_BASE_LR, BN_FREE_BASE_BATCH, BN_FREE_MAX_LR))
    lr = min(base * math.sqrt(global_batch / base_batch), cap)
    warmup = mlperf_lars_warmup_epochs(global_batch)
    return Recipe(lr=lr, warmup_epochs=warmup, schedule="poly",
                  why=f"{kind} model: lr {base:g} x sqrt({global_batch}/{base_batch}) = {lr:.4g}"
                      f"{' (capped)' if lr == cap else ''} (square-root scaling), {warmup:g} "
                      f"warm-up epochs, poly")


RECIPE_ROWS["lamb"] = recipe_row
