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
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.optim import Optimizer

__all__ = ["LAMB"]


class LAMB(Optimizer):
    """LAMB (module docstring). Per-group options: lr, betas, eps, weight_decay, exclude_1d,
    lr_1d_scale. State per parameter: ``step``, ``exp_avg`` (m), ``exp_avg_sq`` (v)."""

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
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
