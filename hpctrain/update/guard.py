"""Non-finite numbers (:class:`NonFiniteGuard`), the same for every update algorithm
(:class:`hpctrain.update.base.UpdateAlgorithm`) — a run stops rather than train on NaN. A NaN or
inf in one rank's loss or gradient makes the *mean* gradient non-finite on every rank, so the
sync's overflow flag sees it everywhere at the same step with no extra collective. Per step:

* flag raised, loss scaler: the step is skipped everywhere and the scale backs off
  (:meth:`hpctrain.update.base.UpdateAlgorithm.apply_mean`);
* flag raised, no scaler: one allgather of each rank's verdict on its own loss and gradient
  (only on this path). Some rank non-finite: :class:`NonFiniteError` on every rank, naming the
  step and the rank(s). None: the finite gradients' sum overflowed on the wire (fp16: a mean
  above 65504; pre-division rules this out in fp32), the step is skipped everywhere and counted
  like a loss scaler's skip; ``MAX_WIRE_SKIPS`` of them in a row stop the job, since the weights
  no longer move;
* after the optimiser step: :func:`~hpctrain.optim.loss_scale.finite_flag` on the weights (one
  pass, small beside a step; a few fused kernels on a GPU). The weights are
  bitwise identical on every rank, so is the verdict; non-finite weights (a finite gradient
  times a huge lr) raise :class:`NonFiniteError` naming the step of the update. On the CPU the
  flag is read at once. On a GPU it stays a device flag, copied to page-locked host memory
  behind the optimiser's kernels with an event (:class:`hpctrain.comm.streams.FlagCopy`) and
  read at the next step (:meth:`NonFiniteGuard.poll`): at one rank only once that copy has
  landed (no host sync at all; a flag not landed yet is AND-ed with the next one on the device),
  at more ranks after waiting for that event only (every rank must raise at the same step),
  and in full when the run finishes or saves (:meth:`NonFiniteGuard.settle`). ``bool(flag)``
  would make the host wait for the next step's forward and backward too.

Where nothing can overflow on finite gradients (no loss scaler, no fp16 on the wire) and the
weight check is lazy (a GPU), the gradient sync's own flag is not read at all
(:func:`flag_needed`): a non-finite loss or gradient makes the weights non-finite, which the
weight check reports one step later, naming the step. On the CPU the read is free and the
diagnosis names the rank.

A loss that is NaN while its gradient stays finite (a NaN constant added to it) is not caught:
it only shows in the epoch's mean loss. Step numbers count from 0 (``lr_at``'s, the trainer's
``step_count`` before the step).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hpctrain.comm.streams import FlagCopy
from hpctrain.errors import UserError
from hpctrain.optim.loss_scale import all_finite, finite_flag

if TYPE_CHECKING:
    from mpi4py import MPI

MAX_WIRE_SKIPS = 10     # consecutive unscaled steps whose finite gradients overflowed the wire


class NonFiniteError(UserError):
    """A loss, gradient or weight became inf/NaN and no loss scaler skipped the step. Raised on
    every rank at the same step with the same message (the CLI prints it as one line, status 2)."""


def agreed_overflow(sync_flag, params) -> bool:
    """The overflow decision: the sync's flag, or a check of the (identical) reduced gradients."""
    if sync_flag is not None:
        return bool(sync_flag)
    grads = [p.grad for p in params if p.grad is not None]
    return bool(grads) and not all_finite(grads)


def flag_needed(scaler, sync, lazy: bool) -> bool:
    """Must a step read the gradient sync's overflow flag (a host sync on a GPU)? With a loss
    scaler (it decides the skip), where finite gradients can overflow on the wire (fp16
    compression at more than one rank: a skip the guard must decide before the update), or
    where the weight check is not lazy (CPU: the read is free and names the rank)."""
    if scaler is not None or not lazy:
        return True
    while not hasattr(sync, "codec"):
        sync = getattr(sync, "inner", None)
        if sync is None:
            return True         # not one of ours: keep the check
    return bool(sync.codec.compresses) and sync.comm.Get_size() > 1


def grad_sync_comm(sync) -> MPI.Comm:
    """The communicator a gradient sync averages over (through wrappers' ``inner``)."""
    while not hasattr(sync, "comm"):
        sync = sync.inner
    return sync.comm


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


class NonFiniteGuard:
    """What happens when the agreed flag says the mean gradient is non-finite and no loss scaler
    handles it, and the weight check after each update (module docstring)."""

    __slots__ = ("comm", "wire_skips", "lazy", "pending", "unchecked")

    def __init__(self, comm, lazy: bool | None = None):
        self.comm = comm            # the gradient sync's: every rank reaches the same calls
        self.wire_skips = 0         # consecutive skipped steps (finite gradients, overflowing sum)
        self.lazy = lazy            # read the weight flag later (None: where it is on a GPU)
        # (first step, last step, device flag, its host copy) of updates not checked yet
        self.pending: tuple[int, int, torch.Tensor, FlagCopy] | None = None
        self.unchecked = False      # a pending update's mean gradient was not checked

    def overflow(self, step: int, loss: torch.Tensor, own_grads_finite: bool) -> None:
        """Collective, at the same step on every rank: raise :class:`NonFiniteError` naming the
        rank(s) whose loss or own gradient is non-finite, else count a skipped step."""
        verdicts = self.comm.allgather((bool(torch.isfinite(loss).all()), bool(own_grads_finite)))
        bad_loss = [r for r, (loss_ok, _) in enumerate(verdicts) if not loss_ok]
        bad_grad = [r for r, (loss_ok, grad_ok) in enumerate(verdicts) if loss_ok and not grad_ok]
        if bad_loss or bad_grad:
            what = []
            if bad_loss:
                what.append(f"non-finite loss on {_ranks(bad_loss)}")
            if bad_grad:
                what.append(f"non-finite gradient (finite loss) on {_ranks(bad_grad)}")
            raise NonFiniteError(f"step {step}: {'; '.join(what)}; stopped on every rank (no loss scaler skips such "
                                 "steps: lower optim.lr, or with fp16 compute set precision.loss_scale)")
        self.wire_skips += 1
        if self.wire_skips >= MAX_WIRE_SKIPS:
            raise NonFiniteError(f"step {step}: the sum of finite gradients overflowed in communication "
                                 f"{self.wire_skips} steps in a row (fp16 carries at most 65504), so the "
                                 "weights no longer change; lower optim.lr or set comm.compression=none")

    def applied(self, step: int, params, grads_checked: bool = True) -> None:
        """After an update: every rank's (identical) weights must be finite. Computes one
        device flag; reads it now, or (``lazy``, the default on a GPU) in :meth:`poll` /
        :meth:`settle`. ``grads_checked`` False: the mean gradient was not checked
        (:func:`flag_needed`), so non-finite weights may come from a non-finite gradient."""
        self.wire_skips = 0
        self.poll()
        flag = finite_flag(params)
        if flag is None:
            return
        self.unchecked = self.unchecked or not grads_checked
        first = step
        if self.pending is not None:    # one rank, the last copy not landed: both in one flag
            first, _, older, _ = self.pending
            flag = flag & older
        self.pending = (first, step, flag, FlagCopy(flag))
        if not (flag.device.type != "cpu" if self.lazy is None else self.lazy):
            self.settle()

    def poll(self) -> None:
        """Per step: read the pending weight flag where that costs no host sync (one rank: its
        copy has landed), or (more ranks) after waiting for its copy's event only, so that
        every rank reads it, and raises, at the same step."""
        if self.pending is None:
            return
        one_rank = getattr(self.comm, "Get_size", lambda: 0)() == 1
        if one_rank and not self.pending[3].ready():
            return
        self.settle()

    def settle(self) -> None:
        """Read the flag of the last update(s), if not read yet; raise if the weights became
        non-finite there. The same on every rank (the weights are identical)."""
        if self.pending is None:
            return
        (first, last, _, copy), self.pending = self.pending, None
        unchecked, self.unchecked = self.unchecked, False
        if not copy.read():
            step = f"step {first}" if first == last else f"steps {first}-{last}"   # one flag for these
            if unchecked:
                raise NonFiniteError(f"{step}: the weights became non-finite in the update on every rank "
                                     "(the mean gradient was not checked: a non-finite loss or gradient, "
                                     "or too large a step: lower optim.lr, or set precision.loss_scale "
                                     "with fp16 compute)")
            raise NonFiniteError(f"{step}: the weights became non-finite in the update on every rank "
                                 "although the mean gradient was finite (lower optim.lr)")
