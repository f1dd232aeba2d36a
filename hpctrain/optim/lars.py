"""LARS: layer-wise adaptive rate scaling for large-batch SGD.

Update for one parameter tensor (one "layer") w with gradient g, as in You et al.,
"Large Batch Training of Convolutional Networks" (arXiv:1708.03888) and the MLPerf
ResNet-50 reference (mlcommons/training, image_classification/tensorflow2/lars_optimizer.py)::

    lambda = eta * |w| / (|g| + beta * |w| + eps)     (lambda = 1 if |w| == 0 or |g| == 0)
    v      = m * v + lr * lambda * (g + beta * w)
    w      = w - v                                    (Nesterov: w = w - (lr*lambda*(g+beta*w) + m*v))

The learning rate sits *inside* the momentum buffer (MLPerf / TF ``ApplyMomentum`` with
lr=1), whereas ``torch.optim.SGD`` keeps it outside. Both give the same trajectory while lr is
constant; under a schedule LARS follows the MLPerf reference.

Exclusions: with ``exclude_1d=True`` (default) every parameter with ``ndim <= 1`` (BN gamma/beta,
biases) gets neither the trust ratio nor weight decay, as the MLPerf reference's skip list
``['batch_normalization', 'bias']`` does (timm ``optim/lars.py`` does the same through
param groups). A group with ``trust_ratio=False`` is plain momentum SGD with weight decay.

LARC clipping (``clip=True``), as NVIDIA apex ``parallel/LARC.py`` (``clip=True``) and timm
``trust_clip``: ``lambda_eff = min(lambda / lr, 1)``, so the per-layer step size
``lr * lambda_eff = min(eta*|w|/(...), lr)``: the local rate is capped by the global one.
The zero-norm fallback (lambda_eff = 1) is applied after clipping, as apex skips such layers.

All per-layer arithmetic stays on the device: norms come from one multi-tensor call
(``kernels.multi_tensor_sq_norms`` when the ``kernels`` package imports, else
``torch._foreach_norm``), zero norms are handled with ``torch.where`` (no ``if norm != 0``
host sync per parameter, cf. timm), and updates use ``torch._foreach_*``.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.optim import Optimizer

NormsFn = Callable[[list[torch.Tensor]], torch.Tensor]

__all__ = ["LARS", "trust_ratio", "resolve_norms_fn"]


def trust_ratio(w_norm: torch.Tensor, g_norm: torch.Tensor, eta: float,
                weight_decay: float, eps: float, clip_lr: float | None = None) -> torch.Tensor:
    """Per-layer LARS multiplier from per-layer norms (tensors of equal shape).

    ``clip_lr`` given: LARC clipping ``min(lambda / clip_lr, 1)``. Layers with a zero weight
    or gradient norm get 1 (decided with ``torch.where``: no host synchronisation).
    """
    ratio = eta * w_norm / (g_norm + weight_decay * w_norm + eps)
    if clip_lr is not None:
        ratio = torch.clamp(ratio / clip_lr, max=1.0)
    ok = (w_norm > 0) & (g_norm > 0)
    return torch.where(ok, ratio, torch.ones_like(ratio))


def _foreach_norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(torch._foreach_norm(tensors))


def _kernels_norms(fn) -> NormsFn:
    def norms(tensors: list[torch.Tensor]) -> torch.Tensor:
        per_tensor_sq, _global_norm = fn(tensors)
        if isinstance(per_tensor_sq, (list, tuple)):
            per_tensor_sq = torch.stack([torch.as_tensor(x, dtype=tensors[0].dtype)
                                         for x in per_tensor_sq])
        return torch.as_tensor(per_tensor_sq, device=tensors[0].device).sqrt()
    return norms


def resolve_norms_fn(prefer_kernels: bool = True) -> tuple[NormsFn, str]:
    """Pick the multi-tensor L2-norm routine: ``(fn, description)``.

    ``kernels.multi_tensor_sq_norms(tensors) -> (per_tensor_sq, global_norm)`` is used when
    the ``kernels`` package is importable; otherwise ``torch._foreach_norm``. The reason for a
    fall-back is part of the description (visible in ``LARS.norms_backend``), not hidden.
    """
    if prefer_kernels:
        try:
            from kernels import multi_tensor_sq_norms
        except ImportError as exc:
            return _foreach_norms, f"torch._foreach_norm (kernels not used: {exc})"
        return _kernels_norms(multi_tensor_sq_norms), "kernels.multi_tensor_sq_norms"
    return _foreach_norms, "torch._foreach_norm"


class LARS(Optimizer):
    """Momentum SGD with LARS trust ratios (see module docstring for the exact update).

    Defaults follow the MLPerf ResNet-50 reference: ``eta=0.001``, ``momentum=0.9``,
    ``eps=0.0`` (its ``lars_epsilon`` flag; safe because zero norms are guarded).
    Per-group options: lr, momentum, weight_decay, nesterov, eta, eps, clip, exclude_1d,
    trust_ratio. State per parameter: ``momentum_buffer`` (zeros-initialised, so the first
    step equals torch SGD's ``clone(d)`` initialisation).
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 nesterov: bool = False, eta: float = 0.001, eps: float = 0.0,
                 clip: bool = False, exclude_1d: bool = True, trust_ratio: bool = True,
                 norms_fn: NormsFn | None = None):
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta <= 0 or eps < 0:
            raise ValueError(f"LARS: invalid hyper-parameter (lr={lr}, momentum={momentum}, "
                             f"weight_decay={weight_decay}, eta={eta}, eps={eps})")
        if nesterov and momentum <= 0:
            raise ValueError("LARS: nesterov=True needs momentum > 0")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                        eta=eta, eps=eps, clip=clip, exclude_1d=exclude_1d,
                        trust_ratio=trust_ratio)
        super().__init__(params, defaults)
        if norms_fn is None:
            norms_fn, self.norms_backend = resolve_norms_fn()
        else:
            self.norms_backend = getattr(norms_fn, "__name__", "custom")
        self._norms = norms_fn

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, updates = self._scaled_updates(group)
            if params:
                self._apply_momentum(group, params, updates)
        return loss

    def _scaled_updates(self, group) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Return params and their ``lr * lambda * (g + beta*w)`` (new tensors; grads untouched)."""
        adapt, decay, skip = [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("LARS does not support sparse gradients")
            if group["exclude_1d"] and p.ndim <= 1:
                skip.append(p)
            elif group["trust_ratio"]:
                adapt.append(p)
            else:
                decay.append(p)
        lr, wd = group["lr"], group["weight_decay"]
        updates: list[torch.Tensor] = []
        if adapt:
            grads = [p.grad for p in adapt]
            norms = self._norms(adapt + grads)
            n = len(adapt)
            ratio = trust_ratio(norms[:n], norms[n:], group["eta"], wd, group["eps"],
                                lr if group["clip"] else None)
            d = torch._foreach_add(grads, adapt, alpha=wd) if wd else [g.clone() for g in grads]
            torch._foreach_mul_(d, list((lr * ratio).unbind(0)))
            updates += d
        if decay:
            grads = [p.grad for p in decay]
            d = torch._foreach_add(grads, decay, alpha=wd) if wd else [g.clone() for g in grads]
            torch._foreach_mul_(d, lr)
            updates += d
        if skip:
            updates += torch._foreach_mul([p.grad for p in skip], lr)
        return adapt + decay + skip, updates

    def _apply_momentum(self, group, params, updates) -> None:
        m = group["momentum"]
        if m == 0:
            torch._foreach_sub_(params, updates)
            return
        bufs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            bufs.append(state["momentum_buffer"])
        torch._foreach_mul_(bufs, m)
        torch._foreach_add_(bufs, updates)
        if group["nesterov"]:
            torch._foreach_add_(updates, bufs, alpha=m)
            torch._foreach_sub_(params, updates)
        else:
            torch._foreach_sub_(params, bufs)
