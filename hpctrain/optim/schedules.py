"""Learning-rate schedules as pure functions of the iteration number.

``lr_at(step, spec)`` is evaluated once per iteration (step 0 = the first update); all
counts are passed in explicitly (timm ``scheduler/``; nanoGPT ``get_lr``). Phases:

1. warm-up, ``0 <= step < warmup_steps``:
   ``lr = warmup_start_lr + (peak_lr - warmup_start_lr) * step / warmup_steps``
   (Goyal et al. 2017 gradual warm-up; MLPerf ``PolynomialDecayWithWarmup`` with start 0).
2. hybrid only, ``warmup_steps <= step < warmup_steps + hold_steps``: ``lr = peak_lr``.
3. decay from ``d0`` (end of phase 1, or of 2 for hybrid), ``s = step - d0``,
   ``D = total_steps - d0``:

   ========  ==============================================================================
   constant  ``peak_lr``
   step      ``peak_lr * step_gamma ** #{milestones <= step}`` (milestones in absolute steps)
   cosine    ``end_lr + (peak_lr - end_lr) * (1 + cos(pi * min(s, D) / D)) / 2``
   poly      ``end_lr + (peak_lr - end_lr) * (1 - min(s, D+1) / (D+1)) ** poly_power``
   ========  ==============================================================================

   ``poly`` reproduces the MLPerf ResNet-50 reference exactly (mlcommons/training
   ``image_classification/tensorflow2/lars_util.py``: ``decay_steps = train_steps -
   warmup_steps + 1``, power 2, end 1e-4), so its last step stays slightly above ``end_lr``.

**Hybrid warm-up (our definition).** Seed 000 (Kasagi et al., Fujitsu's large-batch
ResNet-50 work; cf. Yamazaki et al., arXiv:1903.12650) names a "hybrid" warm-up, but its exact
formula is not in any public source we could read. We implement the reading that the name and
the surrounding literature support: Goyal's linear warm-up to the peak, then a *constant
phase at the peak* until a switch step (``warmup_steps + hold_steps``; the switch epoch),
then the chosen decay, which starts from the peak. It combines the gradual warm-up with the
"hold the peak before decaying" of slow-start schedules (Akiba et al., arXiv:1711.04325) and
makes the switch epoch a tunable. ``hold_steps = 0`` makes it identical to ``linear``.

**Label smoothing** is ``torch.nn.CrossEntropyLoss(label_smoothing=eps)``, built by
``hpctrain.optim.make_criterion``: loss = (1-eps) * NLL(y) + eps * mean_k(-log p_k)
(Szegedy et al. 2016), checked against that formula in tests/unit/test_schedules.py.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .registry import registered_name

__all__ = ["ScheduleSpec", "lr_at", "linear_scaled_lr", "describe_lr", "mlperf_lars_base_lr",
           "mlperf_lars_warmup_epochs", "spec_from_config", "KINDS", "WARMUPS", "Unset", "UNSET",
           "GOYAL_UNSET", "unset_defaults"]

KINDS = ("constant", "step", "cosine", "poly")
WARMUPS = ("linear", "hybrid", "none")


@dataclass(frozen=True)
class Unset:
    """What a schedule takes where ``lr`` or ``warmup_epochs`` is left unset (None in
    :func:`spec_from_config`): the lr, scaled linearly from ``base_batch`` (when ``scale_lr``) or
    the peak itself (``scaled=False``, a table given per global batch), and the warm-up epochs;
    ``source`` names the table in the start-up line."""
    lr: float
    warmup_epochs: float
    scaled: bool = True
    source: str = ""


GOYAL_UNSET = Unset(lr=0.1, warmup_epochs=5.0)
"""Unset for an optimiser that registers nothing of its own (SGD, LAMB, plugins): Goyal et al.'s
0.1 at batch 256, linearly scaled, and 5 warm-up epochs."""

UNSET: dict[str, Callable[[int], Unset]] = {}
"""An optimiser's own :class:`Unset`, a function of the global batch, under its registered name;
its own file fills it (LARS, the MLPerf table: ``UNSET["lars"] = unset`` in ``lars.py``)."""


def unset_defaults(optimizer: str | None, global_batch: int) -> Unset:
    """The :class:`Unset` of ``optimizer`` (a registered name or ``package.module:factory``; an
    unknown one is a ValueError naming the choices) at ``global_batch``; None: :data:`GOYAL_UNSET`."""
    name = registered_name(optimizer) if optimizer is not None else None
    return UNSET[name](global_batch) if name in UNSET else GOYAL_UNSET


@dataclass(frozen=True)
class ScheduleSpec:
    """Everything ``lr_at`` needs; all counts in iterations (optimizer steps)."""
    peak_lr: float
    warmup_steps: int
    total_steps: int
    kind: str = "poly"
    warmup: str = "linear"
    poly_power: float = 2.0
    end_lr: float = 1e-4
    step_milestones: tuple[int, ...] = ()
    step_gamma: float = 0.1
    warmup_start_lr: float = 0.0
    hold_steps: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"schedule kind {self.kind!r} not in {KINDS}")
        if self.warmup not in WARMUPS:
            raise ValueError(f"warmup {self.warmup!r} not in {WARMUPS}")
        if self.total_steps <= 0 or self.warmup_steps < 0 or self.hold_steps < 0:
            raise ValueError(f"schedule needs total_steps > 0 and non-negative warm-up/hold "
                             f"(total={self.total_steps}, warmup={self.warmup_steps}, "
                             f"hold={self.hold_steps})")
        if self.decay_start > self.total_steps:
            raise ValueError(f"warm-up ({self.warmup_steps}) + hold ({self.hold_steps}) steps "
                             f"exceed total_steps ({self.total_steps})")
        if self.peak_lr < 0 or self.end_lr < 0 or self.warmup_start_lr < 0:
            raise ValueError("learning rates must be >= 0")

    @property
    def effective_warmup_steps(self) -> int:
        return 0 if self.warmup == "none" else self.warmup_steps

    @property
    def decay_start(self) -> int:
        """First step of the decay phase (the hybrid switch step)."""
        hold = self.hold_steps if self.warmup == "hybrid" else 0
        return self.effective_warmup_steps + hold


def lr_at(step: int, spec: ScheduleSpec) -> float:
    """Learning rate for iteration ``step`` (0-based) under ``spec``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    w = spec.effective_warmup_steps
    if step < w:
        return spec.warmup_start_lr + (spec.peak_lr - spec.warmup_start_lr) * step / w
    d0 = spec.decay_start
    if step < d0 or spec.kind == "constant":
        return spec.peak_lr
    if spec.kind == "step":
        n_drops = sum(1 for m in spec.step_milestones if m <= step)
        return spec.peak_lr * spec.step_gamma ** n_drops
    s = step - d0
    span = spec.total_steps - d0
    if spec.kind == "cosine":
        frac = min(s, span) / span if span > 0 else 1.0
        return spec.end_lr + (spec.peak_lr - spec.end_lr) * 0.5 * (1.0 + math.cos(math.pi * frac))
    decay_steps = span + 1                                  # MLPerf lars_util.py convention
    frac = min(s, decay_steps) / decay_steps
    return spec.end_lr + (spec.peak_lr - spec.end_lr) * (1.0 - frac) ** spec.poly_power


def linear_scaled_lr(base_lr: float, global_batch: int, base_batch: int = 256) -> float:
    """Goyal et al. linear scaling rule: ``base_lr * global_batch / base_batch``."""
    return base_lr * global_batch / base_batch


def describe_lr(cfg_optim, global_batch: int) -> str:
    """One line stating the peak lr a run uses and why, for the start-up output, e.g.
    ``lr 0.025 = 0.1 x 64/256 (optim.scale_lr; set optim.scale_lr=false to use 0.1 as given)``.

    ``cfg_optim`` is the ``optim`` config section (``lr``, ``base_batch``, ``scale_lr``, ``name``);
    the number is the one :func:`spec_from_config` computes. (With ``optim.recipe = "auto"`` the
    job states the recipe's line instead: :func:`~hpctrain.optim.recipe.apply_recipe`.)
    """
    lr, base_batch, scale = cfg_optim.lr, cfg_optim.base_batch, cfg_optim.scale_lr
    unset = unset_defaults(cfg_optim.name, global_batch)
    if lr is None and not unset.scaled:
        return f"lr {unset.lr:g} ({unset.source} for global batch {global_batch}; set optim.lr to choose)"
    given = unset.lr if lr is None else lr
    if not scale:
        return f"lr {given:g} as given (optim.scale_lr=false)"
    peak = linear_scaled_lr(given, global_batch, base_batch)
    if global_batch == base_batch:
        return (f"lr {peak:g} = {given:g} x {global_batch}/{base_batch} (optim.scale_lr; the global batch "
                f"equals optim.base_batch)")
    return (f"lr {peak:g} = {given:g} x {global_batch}/{base_batch} (optim.scale_lr; set "
            f"optim.scale_lr=false to use {given:g} as given)")


def mlperf_lars_base_lr(global_batch: int) -> float:
    """Peak LARS lr of the MLPerf ResNet-50 reference: <16K: 10, <32K: 25, else 31.2."""
    if global_batch < 16384:
        return 10.0
    if global_batch < 32768:
        return 25.0
    return 31.2


def mlperf_lars_warmup_epochs(global_batch: int) -> float:
    """Warm-up epochs of the MLPerf ResNet-50 reference: 25 for >= 32K, else 5."""
    return 25.0 if global_batch >= 32768 else 5.0


def spec_from_config(*, lr: float | None, global_batch: int, steps_per_epoch: int,
                     epochs: float, warmup_epochs: float | None, kind: str = "poly",
                     warmup: str = "linear", optimizer: str | None = None, base_batch: int = 256,
                     scale_lr: bool = True, poly_power: float = 2.0, end_lr: float = 1e-4,
                     step_epochs: Sequence[float] = (), step_gamma: float = 0.1,
                     hold_epochs: float | None = None,
                     warmup_start_lr: float = 0.0) -> ScheduleSpec:
    """Build a ``ScheduleSpec`` from config-level values (epochs are converted to steps).

    Peak lr: ``lr`` is the lr at ``base_batch`` scaled linearly to ``global_batch`` when
    ``scale_lr`` (Goyal et al.), else the peak itself. ``lr=None`` or ``warmup_epochs=None``:
    the optimiser's published values (:func:`unset_defaults`: LARS registers the MLPerf table,
    unscaled; SGD, LAMB, a plugin and ``optimizer=None`` take 0.1 linearly scaled and 5 epochs).
    ``hold_epochs`` (hybrid only) defaults to ``warmup_epochs``: switch at 2x warm-up.
    """
    unset = unset_defaults(optimizer, global_batch)     # an unknown name: one line naming the choices
    if steps_per_epoch <= 0 or epochs <= 0 or global_batch <= 0:
        raise ValueError("steps_per_epoch, epochs and global_batch must be > 0")
    if lr is None and not unset.scaled:
        peak = unset.lr
    else:
        base = unset.lr if lr is None else lr
        peak = linear_scaled_lr(base, global_batch, base_batch) if scale_lr else base
    if warmup_epochs is None:
        warmup_epochs = unset.warmup_epochs
    if hold_epochs is None:
        hold_epochs = warmup_epochs if warmup == "hybrid" else 0.0
    to_steps = lambda e: int(round(e * steps_per_epoch))  # noqa: E731
    return ScheduleSpec(
        peak_lr=peak, warmup_steps=to_steps(warmup_epochs) if warmup != "none" else 0,
        total_steps=to_steps(epochs), kind=kind, warmup=warmup, poly_power=poly_power,
        end_lr=end_lr, step_milestones=tuple(to_steps(e) for e in step_epochs),
        step_gamma=step_gamma, warmup_start_lr=warmup_start_lr,
        hold_steps=to_steps(hold_epochs) if warmup == "hybrid" else 0)
