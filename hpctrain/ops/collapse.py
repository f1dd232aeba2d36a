"""A training collapse: the loss fell well below chance, then went back to it and stayed there.

A network that learned and then died (every ReLU off, the logits constant: the loss of a
cross-entropy classifier is then ln C for C balanced classes) keeps a finite loss, so the
non-finite guard never fires and the run would end "done" at chance accuracy. The rule here
(docs/operations.md, "Collapse") works on the per-step training loss averaged over the ranks:

* smoothed: an exponential moving average with time constant ``smoothing`` steps
  (``ema += (loss - ema) / smoothing``, started at the first loss), so one noisy step does not
  count; non-finite losses are skipped (they are the non-finite guard's);
* learned: the smoothed loss has been at or below ``learned_below × chance`` (0.5 ln C);
* back at chance: after that, the smoothed loss is at or above ``back_at × chance`` (0.9 ln C:
  a dead net that learned the class prior of slightly unbalanced data sits just under ln C);
  a loss far above chance counts too;
* collapsed: back at chance for ``steps`` consecutive steps. Dropping below the threshold again
  (a spike the run recovered from) resets the count.

A resumed run is judged with its history: a checkpoint written while the run was dying holds a
dead network whose loss never falls again, so the detector starts *learned* when an earlier leg's
epoch loss in ``metrics.jsonl`` was below the threshold (:func:`learned_before`).

A run that never learned (the smoothed loss never at half of chance, and at chance at its end) has
not collapsed, and is not done either: :func:`ended_at_chance` says so at the end of a run that had
the warm-up plus ``steps`` steps to leave chance (a shorter run, a smoke test, is not judged).

The verdict names the step of the lowest smoothed loss before the climb (where the run turned)
and the first step back at chance. :class:`CollapseDetector` is pure (no MPI, no torch): the job
feeds it the rank-averaged losses, so every rank reaches the same verdict at the same step.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["CollapseRule", "Collapse", "CollapseDetector", "detect_collapse", "chance_loss", "at_chance",
           "explain", "learned_before", "ended_at_chance", "explain_never_learned", "ON_COLLAPSE"]

ON_COLLAPSE = ("stop", "warn")     # train.on_collapse: end the job (status 6) or print the line and go on


def chance_loss(num_classes: int) -> float:
    """Cross-entropy of a uniform prediction over ``num_classes``: ln C (label smoothing leaves
    it unchanged: both of its terms are ln C for the uniform prediction)."""
    if num_classes < 2:
        raise ValueError(f"a classifier needs at least 2 classes, got {num_classes}")
    return math.log(num_classes)


def at_chance(loss: float, num_classes: int, back_at: float = 0.9) -> bool:
    """Is ``loss`` (a mean cross-entropy) at the chance level, by the rule's threshold? A NaN is."""
    return not loss < back_at * chance_loss(num_classes)


@dataclass(frozen=True)
class CollapseRule:
    """The thresholds (module docstring); ``chance`` is ln C."""
    chance: float
    steps: int = 100
    learned_below: float = 0.5
    back_at: float = 0.9
    smoothing: float = 10.0

    def __post_init__(self):
        if not (self.chance > 0 and self.steps >= 1 and 0 < self.learned_below < self.back_at
                and self.smoothing >= 1):
            raise ValueError(f"collapse rule: invalid {self}")


@dataclass(frozen=True)
class Collapse:
    """The verdict: where the run turned and since when it has been at chance."""
    turned_step: int            # step of the lowest smoothed loss before the climb
    lowest_loss: float          # that smoothed loss
    chance_since: int           # first step of the run of steps at chance
    step: int                   # the step at which the rule was met
    smoothed_loss: float        # the smoothed loss then
    chance: float


class CollapseDetector:
    """Feed per-step losses in order; :meth:`feed` returns the :class:`Collapse` the first time
    the rule is met (and every time after, for the same collapse, while it lasts)."""

    __slots__ = ("rule", "ema", "lowest", "lowest_step", "learned", "since", "count")

    def __init__(self, rule: CollapseRule):
        self.rule = rule
        self.ema: float | None = None
        self.lowest, self.lowest_step = math.inf, -1      # lowest smoothed loss so far, and its step
        self.learned = False
        self.since, self.count = -1, 0                    # the current run of steps at chance

    def arm(self, lowest_loss: float, lowest_step: int) -> None:
        """Start as a run that has learned (a resume: :func:`learned_before`)."""
        self.learned, self.lowest, self.lowest_step = True, lowest_loss, lowest_step

    def feed(self, first_step: int, losses: Iterable[float]) -> Collapse | None:
        """Take the losses of steps ``first_step, first_step + 1, ...``; the verdict or None."""
        verdict = None
        for step, loss in enumerate(losses, start=first_step):
            now = self._one(step, float(loss))
            verdict = verdict or now                      # the step at which the rule was first met
        return verdict

    def _one(self, step: int, loss: float) -> Collapse | None:
        r = self.rule
        if not math.isfinite(loss):
            return None
        self.ema = loss if self.ema is None else self.ema + (loss - self.ema) / r.smoothing
        if self.ema <= r.learned_below * r.chance:
            self.learned = True
        if not self.learned or self.ema < r.back_at * r.chance:
            if self.ema < self.lowest:
                self.lowest, self.lowest_step = self.ema, step
            self.since, self.count = -1, 0
            return None
        if self.count == 0:
            self.since = step
        self.count += 1
        if self.count < r.steps:
            return None
        return Collapse(turned_step=self.lowest_step, lowest_loss=self.lowest, chance_since=self.since, step=step,
                        smoothed_loss=self.ema, chance=r.chance)


def learned_before(records: Iterable[dict], rule: CollapseRule) -> tuple[float, int] | None:
    """(lowest epoch training loss, its step) of the earlier legs' ``epoch`` records, if it was at
    or below the rule's *learned* threshold; else None."""
    best: tuple[float, int] | None = None
    for rec in records:
        loss = rec.get("train_loss") if rec.get("event") == "epoch" else None
        if isinstance(loss, (int, float)) and math.isfinite(loss) and (best is None or loss < best[0]):
            best = (float(loss), int(rec.get("step", -1)))
    return best if best is not None and best[0] <= rule.learned_below * rule.chance else None


def ended_at_chance(detector: CollapseDetector, steps_trained: int, warmup_steps: int) -> float | None:
    """The smoothed loss at the end of a run that never learned and ends at chance (module
    docstring), else None. Judged only when the run took at least ``warmup_steps + rule.steps``
    steps; a run armed from its history (resumed after it had learned) is the collapse rule's."""
    r = detector.rule
    if detector.learned or detector.ema is None or steps_trained < warmup_steps + r.steps:
        return None
    return detector.ema if detector.ema >= r.back_at * r.chance else None


def explain_never_learned(smoothed_loss: float, chance: float, steps: int, test_accuracy: float,
                          lr_line: str) -> str:
    """The one line rank 0 prints for :func:`ended_at_chance`."""
    return (f"training never left chance: after {steps} steps the loss (smoothed) is {smoothed_loss:.4g}, at chance "
            f"(ln C = {chance:.4g}), and it never fell to half of that; test accuracy {100 * test_accuracy:.2f}%; "
            f"likely causes: a learning rate too small to move the net or so large it died at once ({lr_line}), "
            f"weight decay too strong, or labels with nothing to learn "
            f"(train.on_collapse=warn ends with status 0, train.collapse_steps=0 never checks)")


def detect_collapse(losses: Iterable[float], rule: CollapseRule, first_step: int = 0) -> Collapse | None:
    """The first collapse in a whole loss curve (one value per step), or None."""
    detector = CollapseDetector(rule)
    for step, loss in enumerate(losses, start=first_step):
        verdict = detector.feed(step, [loss])
        if verdict is not None:
            return verdict
    return None


def explain(c: Collapse, steps_per_epoch: int, lr_of: Callable[[int], float | None], warmup_steps: int,
            lr_line: str) -> str:
    """The one line rank 0 prints: where the run turned, since when it is at chance, and the
    likely causes (the lr there against the warm-up, the lr rule or recipe row in use)."""
    def where(step: int) -> str:
        return f"epoch {step // steps_per_epoch} step {step}"
    lr = lr_of(c.turned_step)
    phase = (f"in the warm-up, which ends at step {warmup_steps}" if c.turned_step < warmup_steps
             else f"after the warm-up ({warmup_steps} steps)")
    return (f"training collapsed: the loss (smoothed) fell to {c.lowest_loss:.3g} at {where(c.turned_step)}, "
            f"then went back to chance (ln C = {c.chance:.4g}) from {where(c.chance_since)} and stayed there to "
            f"{where(c.step)} ({c.smoothed_loss:.4g}); likely causes: the learning rate"
            f"{f' ({lr:.4g} at the turn, {phase})' if lr is not None else ''} too high for this model and data, "
            f"the warm-up too short, or the rule in use ({lr_line}); lower optim.lr, lengthen "
            f"optim.warmup_epochs, or resume from a checkpoint before the turn "
            f"(train.on_collapse=warn goes on, train.collapse_steps=0 never checks)")


class CollapseWatch:
    """The job's side (collective over ``comm``): per-step losses kept on the device, averaged
    over the ranks every ``rule.steps`` steps and at each epoch's end (one small allreduce; every
    rank calls :meth:`flush` at the same steps, so every rank gets the same verdict)."""

    def __init__(self, comm, rule: CollapseRule):
        self.comm, self.detector = comm, CollapseDetector(rule)
        self.first_step = 0
        self.pending: list = []           # this window's losses: 0-d tensors on the model's device
        self.warned = False               # train.on_collapse = "warn": the line printed once

    def add(self, step: int, loss) -> bool:
        """Keep step ``step``'s loss (a 0-d tensor, no host sync); True when a flush is due."""
        if not self.pending:
            self.first_step = step
        self.pending.append(loss.detach().reshape(()))
        return len(self.pending) >= self.detector.rule.steps

    def flush(self) -> Collapse | None:
        """Collective: average the kept losses over the ranks and feed them to the detector."""
        import torch
        from mpi4py import MPI
        if not self.pending:                  # every rank steps alike: empty on every rank
            return None
        buf = torch.stack(self.pending).double().cpu().numpy().copy()
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        self.pending = []
        return self.detector.feed(self.first_step, buf / self.comm.Get_size())
