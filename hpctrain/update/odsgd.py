"""OD-SGD: one-step delay SGD — the gradient allreduce of step t runs during step t+1's compute.

Xu, Dong, Xu, Liao, "OD-SGD: One-step Delay Stochastic Gradient Descent for Distributed
Training", arXiv:2005.06728 (2020). The authors' MXNet code (github.com/CynthiaProtector/OD-SGD):
``src/kvstore/kvstore_dist.h`` (``Push_``: right after pushing its gradient the worker applies a
*local updater* to a copy of the last pulled global weights; ``PullImpl``: the pulled global
weights become that copy), ``python/mxnet/model.py`` (plain ``dist_sync`` for the first 200
pulls), ``example/image-classification/common/fit.py`` (``--optimizer-local``, ``--lr-local``,
``--mom-local``). The paper has a parameter server; here there is none: every rank applies the
same global update to the same mean gradient, so all ranks hold the same global weights W.

State on rank k when step t begins (after warm-up): the global weights W_{t-1}; the local weights
ŵ_t^k = W_{t-1} - η_l·g_{t-1}^k in the model's parameters; the global optimiser's state (momentum
fed only with mean gradients: identical on every rank); the local optimiser's buffer u^k; and one
non-blocking allreduce in flight, of g_{t-1}^k, tagged with step t-1's learning rates.

Step t, in this order:

1. forward/backward on ŵ_t^k -> g_t^k. The allreduce of g_{t-1} progresses meanwhile: every
   module's forward pre-hook and every parameter's grad hook polls it (MPI moves data only
   inside MPI calls; :mod:`hpctrain.comm.progress`).
2. wait for ḡ_{t-1} = mean_k g_{t-1}^k (the exposed communication, span "allreduce"; polling
   and ``sched_yield`` rather than MPI's spinning wait, so on a shared core the ranks the ring
   waits for get to run; oversubscribed, it cut the wait many-fold: docs/environment.md); global
   update W_t = opt(W_{t-1}, ḡ_{t-1}) with the real optimiser (SGD/LARS, momentum, weight decay)
   at step t-1's learning rates (span "optimizer"). With loss scaling, an overflow of ḡ_{t-1}
   skips this update on every rank and backs the scale off. Without, the overflow is handled
   as SSGD's (:class:`~hpctrain.update.ssgd.NonFiniteGuard`, naming step t-1): this rank's own
   verdict is its loss of step t-1 and ŵ_t = W_{t-1} - η_l·g_{t-1}^k, finite exactly when its
   gradient was; W_t is checked after the update. So a NaN is stopped one step later than
   under SSGD, when the delayed mean arrives — the algorithm's delay, no extra check.
3. optional delay compensation (DC-ASGD, Zheng et al., ICML 2017, arXiv:1609.08326):
   g_t^k <- g_t^k + λ·g_t^k⊙g_t^k⊙(W_t - ŵ_t^k), a first-order estimate of the gradient at W_t,
   where it is applied. (The sign is DC-ASGD's: weights where applied minus where computed.)
4. start the non-blocking allreduce of g_t^k (span "allreduce").
5. local update (span "local_update"): u^k <- μ_l·u^k + g_t^k; ŵ_{t+1}^k = W_t - η_l·u^k. With
   μ_l = 0 (default) this is ŵ_{t+1}^k = W_t - η_l·g_t^k and the local optimiser keeps nothing.
   η_l = ``local_lr``, or step t's lr of the parameter's group when ``local_lr`` is 0.

The first ``warmup_steps`` steps are plain SSGD (the :class:`~hpctrain.update.ssgd.SSGD` code).

:meth:`finish` (collective; ``DistributedTrainer.finish``) completes the update in flight and
sets ŵ := W and u := 0: a synchronisation point, after which the parameters hold the global
weights and the state is the same on every rank — what evaluation and checkpoints need. The
next step then starts like the first OD-SGD step. So a checkpoint is (W = ŵ, the global
optimiser state, loss scaler, step count); a run resumed from it continues bit-identically to
the run that wrote it (which passed the same synchronisation point). :meth:`state_dict` refuses
while an update is in flight: only rank 0 writes checkpoints, and the pending mean needs all.

Memory: one more weight-sized buffer (whichever of W/ŵ the parameters do not hold; they are
swapped by ``p.data``, not copied) and one gradient-sized buffer for this rank's gradients
(private: the round in flight owns the bucket buffers; the means are read in the buckets as
views); plus u^k when μ_l > 0. Extra work per step over SSGD: the local update (one pass over W, g and ŵ).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Annotated

import torch

from hpctrain.config.plugins import check_options
from hpctrain.config.values import FRACTION, NON_NEGATIVE, Option, Range
from hpctrain.errors import ConfigError
from hpctrain.ops.metrics import NULL_TIMER, Timer
from hpctrain.optim.loss_scale import all_finite, finite_flag
from hpctrain.update.base import ALGORITHMS, StepResult, UpdateAlgorithm, group_lrs
from hpctrain.update.guard import agreed_overflow
from hpctrain.update.ssgd import SSGD

__all__ = ["ODSGD", "Round", "dc_compensate_", "group_lrs", "scales_lr_per_layer", "swap_data_"]


def flag_stays_on_device(tensors) -> bool:
    """Does the local step select on a device-side finite flag instead of reading it? Where the
    gradients live in device memory (a test seam: CPU runs may take the device's path)."""
    first = next((t for t in tensors if t is not None), None)
    return first is not None and first.device.type != "cpu"


class Round:
    """The allreduce in flight: what its global update needs besides the mean."""

    __slots__ = ("lrs", "scale", "step", "loss")

    def __init__(self, lrs: list[float], scale: float, step: int, loss: torch.Tensor):
        self.lrs, self.scale = lrs, scale      # step's lr per param group; loss scale of its backward
        self.step, self.loss = step, loss      # its step index; this rank's loss there (diagnosis)


def dc_compensate_(grads, local_w, global_w, lam: float) -> None:
    """DC-ASGD in place: g <- g + lam * g*g*(global_w - local_w) (tensor lists)."""
    for g, w_loc, w_glob in zip(grads, local_w, global_w):
        g.add_(g * g * (w_glob - w_loc), alpha=lam)


def scales_lr_per_layer(optimizer: torch.optim.Optimizer) -> bool:
    """Does the optimiser scale its lr per layer by a trust ratio (LARS, LAMB-like)? Read from
    its hyperparameters (a trust coefficient ``eta`` in a group), so the update algorithm needs
    no import of any optimiser class."""
    return any("eta" in g for g in optimizer.param_groups)


def swap_data_(params, store: list[torch.Tensor]) -> None:
    """Exchange each parameter's storage with ``store[i]`` (pointers only, nothing copied)."""
    for i, p in enumerate(params):
        current = p.data
        p.data = store[i]
        store[i] = current


# The options ([update.odsgd] in the config): type, help and range, read by the config and checked here.
WarmupSteps = Annotated[int, Option("plain SSGD for the first N steps", NON_NEGATIVE)]
LocalLr = Annotated[float, Option("lr of the local compensating update (0: the global lr)", Range(0, 1e3))]
LocalMomentum = Annotated[float, Option("momentum of the local optimiser (0: stateless W - lr*g)", FRACTION)]
DcLambda = Annotated[float, Option("DC-ASGD delay-compensation strength (0: off)", Range(0, 1e3))]


@ALGORITHMS.register("odsgd")
class ODSGD(UpdateAlgorithm):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_sync, *,
                 warmup_steps: WarmupSteps = 200, local_lr: LocalLr = 0.0, local_momentum: LocalMomentum = 0.0,
                 dc_lambda: DcLambda = 0.0, scaler=None, timer: Timer = NULL_TIMER):
        check_options(ODSGD, "update.odsgd", locals())      # each Option-annotated keyword's range
        if local_lr == 0 and scales_lr_per_layer(optimizer):
            raise ConfigError("update.odsgd.local_lr: set it explicitly with LARS (its lr is scaled per layer "
                             "by trust ratios, so the raw global lr would make the local step far too large)")
        super().__init__(model, optimizer, grad_sync, scaler=scaler, timer=timer)
        self.warmup_steps, self.local_lr = int(warmup_steps), float(local_lr)
        self.local_momentum, self.dc_lambda = float(local_momentum), float(dc_lambda)
        self.ssgd = SSGD(model, optimizer, grad_sync, scaler=scaler, timer=timer)
        self.guard = self.ssgd.guard    # one guard: warm-up and OD-SGD steps count wire skips alike
        # Group *indices*: ``optimizer.load_state_dict`` replaces the group dicts.
        group_of = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
        self._group_index = [group_of.get(id(p)) for p in self.params]   # None: not optimised
        self._round: Round | None = None
        # allocated at the first OD-SGD step
        self._store: list[torch.Tensor] = []
        self._grads: list[torch.Tensor] = []
        self._local_buf: list[torch.Tensor] | None = None
        # removed by close() (DistributedTrainer.close)
        self._hooks = [m.register_forward_pre_hook(self._poll_hook) for m in model.modules()]
        self._hooks += [p.register_post_accumulate_grad_hook(self._poll_hook) for p in self.params]

    # --- progress ---------------------------------------------------------------------------------
    def _poll_hook(self, *_):
        if self._round is not None:
            self.grad_sync.poll()

    @property
    def in_flight(self) -> bool:
        """Is a global update waiting for its allreduce?"""
        return self._round is not None

    def global_weights(self) -> list[torch.Tensor]:
        """W (read-only views): the parameters themselves when nothing is in flight."""
        if self._round is None:
            return [p.detach() for p in self.params]
        return list(self._store)

    # --- the step ---------------------------------------------------------------------------------
    def step(self, compute_loss: Callable[[], torch.Tensor]) -> StepResult:
        if self.steps < self.warmup_steps:
            self.ssgd.steps = self.steps
            self.steps += 1
            return self.ssgd.step(compute_loss)
        self._allocate()
        for p, g in zip(self.params, self._grads):    # private: the round in flight owns the
            if p.grad is not g:                       # bucket buffers (p.grad may still view
                p.grad = g                            # them after a warm-up SSGD step)
        self.optimizer.zero_grad(set_to_none=False)
        with self.timer.span("forward"):
            loss = compute_loss()
        scale = self.scaler.scale if self.scaler else 1.0
        with self.timer.span("backward"):
            (loss * scale if self.scaler else loss).backward()
        stale = self._round is not None            # ŵ_t != W_t: a global update is pending
        skipped = self._complete_round() if stale else False   # parameters now hold W_t
        if self.dc_lambda and stale:
            have = [i for i, p in enumerate(self.params) if p.grad is not None]
            dc_compensate_([self.params[i].grad for i in have], [self._store[i] for i in have],
                           [self.params[i].detach() for i in have], self.dc_lambda / scale)
        with self.timer.span("allreduce"):
            self.grad_sync.begin()
        self._round = Round([g["lr"] for g in self.optimizer.param_groups], scale, self.steps, loss.detach())
        with self.timer.span("local_update"):
            self._local_update(1.0 / scale)
        self.steps += 1
        return StepResult(loss.detach(), skipped=skipped)

    def _allocate(self) -> None:
        if not self._store:
            self._store = [torch.empty_like(p) for p in self.params]
            self._grads = [torch.zeros_like(p) for p in self.params]
            if self.local_momentum:
                self._local_buf = [torch.zeros_like(p) for p in self.params]

    def _complete_round(self) -> bool:
        """Wait for the mean in flight and apply the global update; returns "skipped (overflow)".

        Before: parameters hold ŵ, ``_store`` holds W_prev, ``p.grad`` this step's gradient.
        After: parameters hold W, ``_store`` holds ŵ, ``p.grad`` unchanged.
        """
        assert self._round is not None and self.guard is not None   # a round in flight, so a sync
        with self.timer.span("allreduce"):
            while not self.grad_sync.poll_reduction():   # a polite wait: on a shared core the ranks
                os.sched_yield()                   # the ring waits for get to run (MPI would spin)
            check = self.grad_flag_needed()
            found_inf = self.grad_sync.finish(scatter=False, check=check)
            self.guard.poll()                      # the last global update's weight flag
            local_grads = [p.grad for p in self.params]
            self.grad_sync.scatter_means()              # p.grad: views of the means (no copy)
        rnd, self._round = self._round, None
        swap_data_(self.params, self._store)
        overflow = agreed_overflow(found_inf, self.params)
        try:                        # this rank's own verdict: ŵ (in _store) is finite iff g was
            return self.apply_mean(rnd.step, overflow, rnd.scale, rnd.loss,
                                   lambda: all_finite(self._store), lrs=rnd.lrs, checked=check)
        finally:
            for p, g in zip(self.params, local_grads):
                p.grad = g

    @torch.no_grad()
    def _local_update(self, inv_scale: float) -> None:
        """``_store`` <- W - η_l·u (u = g, or the local momentum), then swap it in as ŵ.

        With a loss scaler, a rank whose gradient overflowed takes no local step (ŵ = W, local
        momentum unchanged). On the CPU that is a branch on the finite flag; on a device the
        flag stays there (:func:`flag_stays_on_device`) and the step selects with it
        (``torch.where``), the same values without a host read that would wait for backward
        every step."""
        grads = [p.grad for p in self.params]
        keep = None         # device: 0-d bool, "this rank's gradients are finite"
        if self.scaler and flag_stays_on_device(grads):
            keep = finite_flag(grads)
        elif self.scaler and not all_finite(grads):
            for p, spare in zip(self.params, self._store):     # this rank's gradient overflowed:
                spare.copy_(p)                                  # ŵ = W, no local step
            swap_data_(self.params, self._store)
            return
        groups = self.optimizer.param_groups
        for i, (p, spare, g) in enumerate(zip(self.params, self._store, grads)):
            gi = self._group_index[i]
            if g is None or gi is None:
                spare.copy_(p)
                continue
            lr = self.local_lr or groups[gi]["lr"]
            if self._local_buf is not None:
                buf = self._local_buf[i]
                if keep is None:
                    g = buf.mul_(self.local_momentum).add_(g, alpha=inv_scale)
                else:
                    g = buf.copy_(torch.where(keep, buf * self.local_momentum + g * inv_scale, buf))
                torch.add(p, g, alpha=-lr, out=spare)
            else:
                torch.add(p, g, alpha=-lr * inv_scale, out=spare)
            if keep is not None:
                torch.where(keep, spare, p, out=spare)
        swap_data_(self.params, self._store)

    # --- synchronisation points and checkpoints ------------------------------------------------
    def finish(self) -> None:
        """Complete the update in flight and set ŵ := W, u := 0 (collective)."""
        if self._round is not None:
            self._complete_round()
        assert self.guard is not None       # OD-SGD always has a grad_sync, so a guard
        self.guard.settle()
        if self._local_buf is not None:
            for b in self._local_buf:
                b.zero_()

    def state_dict(self) -> dict:
        if self._round is not None:
            raise RuntimeError("OD-SGD has a global update in flight: call trainer.finish() on every rank "
                               "before state_dict()/a checkpoint")
        return super().state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Collective when a round is in flight (it is drained and dropped)."""
        if self._round is not None:
            self.grad_sync.finish(scatter=False)           # the model's state was loaded already
            self._round = None
        if self._local_buf is not None:
            for b in self._local_buf:
                b.zero_()
        super().load_state_dict(state)

    def remove_hooks(self) -> None:
        """The progress hooks on the model go (:meth:`close`, which the trainer calls)."""
        self.close()
