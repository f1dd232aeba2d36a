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
  flag is read at once. On a GPU it stays a device flag, read lazily (:meth:`NonFiniteGuard.settle`)
  once the next step's gradient sync has returned - by then the device has long computed it,
  so the read costs no stall - or when the run finishes; reading it at once would make the host
  wait for the optimiser's kernels every step instead of queuing the next forward.

A loss that is NaN while its gradient stays finite (a NaN constant added to it) is not caught:
it only shows in the epoch's mean loss. Step numbers count from 0 (``lr_at``'s, the trainer's
``step_count`` before the step).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

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

    __slots__ = ("comm", "wire_skips", "lazy", "pending")

    def __init__(self, comm, lazy: bool | None = None):
        self.comm = comm            # the gradient sync's: every rank reaches the same calls
        self.wire_skips = 0         # consecutive skipped steps (finite gradients, overflowing sum)
        self.lazy = lazy            # read the weight flag later (None: where it is on a GPU)
        self.pending: tuple[int, torch.Tensor] | None = None    # (step, device flag) of an update not checked yet

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

    def applied(self, step: int, params) -> None:
        """After an update: every rank's (identical) weights must be finite. Computes one
        device flag; reads it now, or (``lazy``, the default on a GPU) in :meth:`settle`."""
        self.wire_skips = 0
        self.settle()
        flag = finite_flag(params)
        if flag is None:
            return
        self.pending = (step, flag)
        if not (flag.device.type != "cpu" if self.lazy is None else self.lazy):
            self.settle()

    def settle(self) -> None:
        """Read the flag of the last update, if not read yet (one host sync); raise if the
        weights became non-finite there. The same on every rank (the weights are identical)."""
        if self.pending is None:
            return
        (step, flag), self.pending = self.pending, None
        if not bool(flag):
            raise NonFiniteError(f"step {step}: the weights became non-finite in the update on every rank "
                                 "although the mean gradient was finite (lower optim.lr)")
