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
param groups). Their lr is ``lr * lr_1d_scale`` (default 1: the raw lr, as MLPerf; on a net
without BatchNorm the raw peak lr blows up the biases, docs/large-batch.md). A group with
``trust_ratio=False`` is plain momentum SGD with weight decay.

LARC clipping (``clip=True``), as NVIDIA apex ``parallel/LARC.py`` (``clip=True``) and timm
``trust_clip``: ``lambda_eff = min(lambda / lr, 1)``, so the per-layer step size
``lr * lambda_eff = min(eta*|w|/(...), lr)``: the local rate is capped by the global one.
The zero-norm fallback (lambda_eff = 1) is applied after clipping, as apex skips such layers.

All per-layer arithmetic stays on the device: norms come from one multi-tensor call
(``kernels.multi_tensor_sq_norms`` when the ``kernels`` package imports, else
``torch._foreach_norm``), zero norms are handled with ``torch.where`` (no ``if norm != 0``
host sync per parameter, cf. timm), and updates use ``torch._foreach_*`` - about six small
kernels per layer on a GPU - except where ``kernels.lars_update`` can run it: fp32 CUDA
tensors with momentum, weight, gradient and momentum laid out alike (contiguous, or all
channels_last: the buckets give a channels_last parameter a channels_last gradient
view), and CuPy present (``kernels.backend()``), one launch for all
tensors of a group (``LARS.update_backend`` says which was chosen, ``LARS.ran`` what the last
step ran; ``fused_update=True`` forces it, e.g. onto its CPU reference in tests, ``False``
never uses it). CUDA tensors without CuPy take ``torch._foreach_norm`` for the norms too: the
kernels' torch reference would make one dot product per tensor and copy every channels_last
weight. That choice is :mod:`lars_backends`'.

As ``optim.name = "lars"`` (the end of this file): its options ``[optim.lars]`` (``eta``, ``eps``,
``clip``: the factory's annotated keywords), its row of the large-batch recipe and, where lr or
the warm-up is unset, the MLPerf ResNet-50 table.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import torch
from torch.optim import Optimizer

from hpctrain.config.plugins import check_options
from hpctrain.config.values import Option, Range
from hpctrain.kernels._args import same_layout

from .lars_backends import NormsFn, resolve_norms_fn, resolve_update_fn
from .recipe import RECIPE_ROWS, Recipe
from .registry import OPTIMIZERS
from .schedules import UNSET, Unset, mlperf_lars_base_lr, mlperf_lars_warmup_epochs

__all__ = ["LARS", "trust_ratio", "resolve_norms_fn", "resolve_update_fn", "build", "recipe_row", "unset"]


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


# The one default of each LARS option, for the class and for the config (build's annotations).
ETA, EPS = 0.001, 1e-9


class LARS(Optimizer):
    """Momentum SGD with LARS trust ratios (see module docstring for the exact update).

    Defaults: ``eta=0.001``, ``momentum=0.9`` as the MLPerf ResNet-50 reference; ``eps=1e-9``
    where the reference's ``lars_epsilon`` is 0 (zero norms are guarded either way; one default for
    the class, ``make_optimizer`` and the config).
    Per-group options: lr, momentum, weight_decay, nesterov, eta, eps, clip, exclude_1d,
    trust_ratio, lr_1d_scale. State per parameter: ``momentum_buffer`` (zeros-initialised, so the first
    step equals torch SGD's ``clone(d)`` initialisation).
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 nesterov: bool = False, eta: float = ETA, eps: float = EPS,
                 clip: bool = False, exclude_1d: bool = True, trust_ratio: bool = True,
                 lr_1d_scale: float = 1.0, norms_fn: NormsFn | None = None, fused_update: bool | None = None):
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta <= 0 or eps < 0 or lr_1d_scale < 0:
            raise ValueError(f"LARS: invalid hyper-parameter (lr={lr}, momentum={momentum}, "
                             f"weight_decay={weight_decay}, eta={eta}, eps={eps}, lr_1d_scale={lr_1d_scale})")
        if nesterov and momentum <= 0:
            raise ValueError("LARS: nesterov=True needs momentum > 0")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                        eta=eta, eps=eps, clip=clip, exclude_1d=exclude_1d,
                        trust_ratio=trust_ratio, lr_1d_scale=lr_1d_scale)
        super().__init__(params, defaults)
        if norms_fn is None:
            norms_fn, self.norms_backend = resolve_norms_fn()
        else:
            self.norms_backend = getattr(norms_fn, "__name__", "custom")
        self._norms = norms_fn
        self.fused_update = fused_update
        self._lars_update, self.update_backend = resolve_update_fn(fused_update)
        self._ran: dict[str, set] = {"norms": set(), "update": set()}
        self.ran: dict[str, str] = {"norms": "none", "update": "none"}
        """What the last :meth:`step` ran (``norms``: ``kernels.multi_tensor_sq_norms`` /
        ``torch._foreach_norm``; ``update``: ``kernels.lars_update`` / ``torch._foreach``;
        several joined by ``+`` where groups differed): what a report should quote, where
        ``norms_backend``/``update_backend`` say what was chosen at construction."""

    def _use_kernel(self, params: list, grads: list) -> bool:
        """Does ``kernels.lars_update`` take this group's update (module docstring)?"""
        if self._lars_update is None:
            return False
        if not all(t.dtype == torch.float32 for t in params + grads):
            return False
        if not all(same_layout(p, g) for p, g in zip(params, grads)):
            return False
        return bool(self.fused_update) or params[0].is_cuda

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]  # torch's overloads split by closure
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._ran = {"norms": set(), "update": set()}
        for group in self.param_groups:
            adapt, decay, skip = self._partition(group)
            lr, wd = group["lr"], group["weight_decay"]
            if adapt:
                grads = [p.grad for p in adapt]
                norms = self._norms(adapt + grads)
                self._ran["norms"].add(getattr(self._norms, "ran", self.norms_backend))
                n = len(adapt)
                ratio = trust_ratio(norms[:n], norms[n:], group["eta"], wd, group["eps"],
                                    lr if group["clip"] else None)
                self._update(group, adapt, list((lr * ratio).unbind(0)), wd)
            if decay:
                self._update(group, decay, lr, wd)
            if skip:
                self._update(group, skip, lr * group.get("lr_1d_scale", 1.0), 0.0)
        self.ran = {k: "+".join(sorted(v)) or "none" for k, v in self._ran.items()}
        return loss

    @staticmethod
    def _partition(group) -> tuple[list, list, list]:
        """(trust-ratio params, plain params with weight decay, excluded 1-D params)."""
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
        return adapt, decay, skip

    def _update(self, group, params: list, step, wd: float) -> None:
        """Apply ``u = step * (g + wd*w)`` through momentum; ``step`` is lr*lambda per tensor
        (list of 0-d tensors) or a float. No temporaries of parameter size are allocated:
        u is accumulated straight into the momentum buffer (or the weights)."""
        grads = [p.grad for p in params]
        per_tensor = isinstance(step, list)
        m = group["momentum"]
        fused = self._lars_update
        bufs = [self._buffer(p) for p in params] if m > 0 else []
        if m > 0 and fused is not None and self._use_kernel(params, grads) and \
                all(same_layout(p, v) for p, v in zip(params, bufs)):      # one launch for the whole group
            arg = torch.stack(step).to(torch.float32) if per_tensor else float(step)
            fused(params, grads, bufs, arg, wd, m, group["nesterov"])
            self._ran["update"].add("kernels.lars_update")
            return
        self._ran["update"].add("torch._foreach")
        if m == 0:                                   # w = w*(1 - step*wd) - step*g
            if wd:
                torch._foreach_mul_(params, _shrink(step, wd, per_tensor))
            _axpy_(params, grads, _neg(step, per_tensor), per_tensor)
            return
        torch._foreach_mul_(bufs, m)                 # v = m*v + step*g + step*wd*w
        _axpy_(bufs, grads, step, per_tensor)
        if wd:
            _axpy_(bufs, params, [wd * s for s in step] if per_tensor else wd * step,
                   per_tensor)
        if group["nesterov"]:                        # w = w - u - m*v
            if wd:
                torch._foreach_mul_(params, _shrink(step, wd, per_tensor))
            _axpy_(params, grads, _neg(step, per_tensor), per_tensor)
            torch._foreach_add_(params, bufs, alpha=-m)
        else:                                        # w = w - v
            torch._foreach_sub_(params, bufs)

    def _buffer(self, p: torch.Tensor) -> torch.Tensor:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state["momentum_buffer"]


def _neg(step, per_tensor: bool):
    """-step per tensor (0-d device tensors: one small kernel each, so only where used)."""
    return [-s for s in step] if per_tensor else -step


def _shrink(step, wd: float, per_tensor: bool):
    """1 - wd*step per tensor, the weight-decay factor (only where used)."""
    return [1.0 - wd * s for s in step] if per_tensor else 1.0 - wd * step


def _axpy_(ys: list, xs: list, a, per_tensor: bool) -> None:
    """ys += a * xs, with ``a`` a float or one 0-d tensor per pair (kept on the device)."""
    if per_tensor:
        torch._foreach_addcmul_(ys, xs, a)
    else:
        torch._foreach_add_(ys, xs, alpha=a)


# --- optim.name = "lars" ---------------------------------------------------------------------------
# Its own options ([optim.lars] in the config): type, help and range, read by hpctrain.config.plugins.
Eta = Annotated[float, Option("LARS trust coefficient eta", Range(0, 1, lo_open=True))]
Eps = Annotated[float, Option("LARS epsilon in the trust ratio denominator", Range(0, 1))]
Clip = Annotated[bool, Option("LARC-style clipping of the trust ratio")]


@OPTIMIZERS.register("lars")
def build(params, *, lr: float, momentum: float, weight_decay: float, nesterov: bool, exclude_1d: bool,
          lr_1d_scale: float, eta: Eta = ETA, eps: Eps = EPS, clip: Clip = False, **_) -> LARS:
    """LARS; its own options checked by the rule the config applies (``[optim.lars]``)."""
    check_options(build, "optim.lars", locals())
    return LARS(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov, eta=eta,
                eps=eps, clip=clip, exclude_1d=exclude_1d, lr_1d_scale=lr_1d_scale)


# BN-free rows: eta such that the peak relative step lr*eta is 0.05 at the MLPerf lr (10 below 16K)
BN_FREE_ETA = 0.005
BN_FREE_LR_1D_SCALE = 0.01          # biases step at lr/100 (0.1 at the peak lr 10)


def recipe_row(global_batch: int, normalised: bool) -> Recipe:
    """Normalised model: MLPerf's ResNet-50 table unchanged (lr 10/25/31.2, eta 0.001, warm-up
    5/5/25 epochs, poly). BN-free: without normalisation the logits scale with the product of
    the layer norms, and a relative step large enough to train in few large-batch steps makes
    them grow until the loss spikes, while the 1-D parameters excluded from the trust ratio
    (biases) take the raw peak lr (10) and blow up; so the same lr and warm-up with a moderate
    eta (the same peak relative step lr*eta at every row) and the 1-D parameters at
    ``lr * lr_1d_scale`` (docs/large-batch.md)."""
    lr, warmup = mlperf_lars_base_lr(global_batch), mlperf_lars_warmup_epochs(global_batch)
    if normalised:
        return Recipe(lr=lr, warmup_epochs=warmup, schedule="poly", options={"eta": 0.001},
                      why=f"MLPerf ResNet-50 table, normalised model: lr {lr:g}, eta 0.001, {warmup:g} warm-up "
                          f"epochs, poly")
    eta = BN_FREE_ETA * 10.0 / lr
    return Recipe(lr=lr, warmup_epochs=warmup, schedule="poly", options={"eta": eta}, lr_1d_scale=BN_FREE_LR_1D_SCALE,
                  why=f"BN-free model: MLPerf lr {lr:g} and {warmup:g} warm-up epochs, eta {eta:g} "
                      f"(peak relative step {lr * eta:g}), 1-D params at lr x {BN_FREE_LR_1D_SCALE:g}, poly")


def unset(global_batch: int) -> Unset:
    """lr unset: the MLPerf table's peak for this global batch, as given (not scaled); warm-up
    unset: the table's epochs."""
    return Unset(lr=mlperf_lars_base_lr(global_batch), warmup_epochs=mlperf_lars_warmup_epochs(global_batch),
                 scaled=False, source="MLPerf LARS table")


RECIPE_ROWS["lars"] = recipe_row
UNSET["lars"] = unset
