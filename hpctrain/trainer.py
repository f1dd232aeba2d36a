"""The library API's centre: make a user's model and optimiser data-parallel over MPI.

``DistributedTrainer`` composes (it does not subclass or proxy) a ``torch.nn.Module``, a
``torch.optim.Optimizer``, a gradient-sync strategy (``hpctrain.comm``) and an update
algorithm (``hpctrain.update``). Call :meth:`step` for a whole step; a loop that must stay its
own can instead call ``trainer.grad_sync.allreduce_grads()`` between its ``backward()`` and its
``optimizer.step()``. The CLI's training loop (``hpctrain.job``) is built on this class.

Buffers (BatchNorm running statistics) are not gradients: each rank updates its own from its own
batches, so replicas drift apart. :meth:`finish` makes every replica rank 0's again — the
checkpointer and the CLI call it before saving and evaluating, and :meth:`evaluation` wraps it
for user loops. ``broadcast_buffers="forward"`` instead broadcasts before every forward, as
DDP's ``broadcast_buffers=True`` does (one small collective per step).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from hpctrain import comm as comm_lib
from hpctrain import update as update_lib
from hpctrain.comm.threads import overlap_unsupported
from hpctrain.models.ghostbn import averaged_buffers
from hpctrain.ops.metrics import NULL_TIMER, StepTimer, Timer
from hpctrain.optim import set_lr
from hpctrain.optim.schedules import ScheduleSpec, lr_at
from hpctrain.topology import Topology

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
BROADCAST_BUFFERS = ("finish", "forward")


def compute_unsupported(compute: str, device: torch.device) -> str | None:
    """Why ``precision.compute`` cannot run on ``device`` (None: it can). fp16 autocast needs a
    GPU (CPU autocast to fp16 runs far slower than fp32; docs/environment.md); bf16 on a GPU
    needs one that supports it (compute capability 8.0 and newer;
    ``torch.cuda.is_bf16_supported``). Autocast follows the model's device
    (:meth:`DistributedTrainer.autocast`), never a fixed one."""
    if compute == "fp16" and device.type == "cpu":
        return ("fp16 compute needs a CUDA device (CPU autocast to fp16 runs far slower than fp32); "
                "use bf16 on CPU")
    if compute == "bf16" and device.type == "cuda":
        with torch.cuda.device(device):
            if not torch.cuda.is_bf16_supported():
                return (f"bf16 compute is not supported by {torch.cuda.get_device_name(device)}; "
                        "use fp16 (with precision.loss_scale=dynamic) or fp32")
    return None


class DistributedTrainer:
    """Data-parallel training of ``model`` with ``optimizer`` over ``topology.comm``.

    On construction the parameters and buffers of rank 0 are broadcast, so every replica
    starts identical. ``step(x, y)`` sets the learning rate from ``schedule`` (if given), runs
    forward/backward under autocast (``compute``), synchronises gradients and updates.
    ``broadcast_buffers``: ``"finish"`` (rank 0's buffers in :meth:`finish`) or ``"forward"``
    (also before every forward, DDP's default). ``algorithm_options`` and ``compression_options``:
    the update algorithm's and the codec's constructor keywords (``[update.<name>]``,
    ``[comm.<name>]``; the CLI's job reads them all from its config,
    :func:`hpctrain.job.setup.trainer_keywords`).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, topology: Topology, *,
                 strategy: str = "auto", compression: str = "none", bucket_mb: float = 25.0,
                 overlap: bool = False, tune: str = "measure", algorithm: str = "ssgd",
                 algorithm_options: dict | None = None,
                 schedule: ScheduleSpec | None = None, loss_fn: Callable | None = None,
                 compute: str = "fp32", scaler=None, timer: StepTimer | None = None, comm_delay_ms: float = 0.0,
                 broadcast_buffers: str = "finish", compression_options: dict | None = None):
        if compute not in AUTOCAST_DTYPES:
            raise ValueError(f"precision.compute: unknown {compute!r} (choose from {', '.join(AUTOCAST_DTYPES)})")
        if broadcast_buffers not in BROADCAST_BUFFERS:
            raise ValueError(f"broadcast_buffers: unknown {broadcast_buffers!r} "
                             f"(choose from {', '.join(BROADCAST_BUFFERS)})")
        self.model, self.optimizer, self.topo = model, optimizer, topology
        self.timer: Timer = NULL_TIMER if timer is None else timer      # NULL_TIMER records nothing
        self.schedule = schedule
        self.broadcast_buffers = broadcast_buffers
        averaged = {id(b) for b in averaged_buffers(model)}    # ghost BatchNorm: the ranks' mean is one process's
        self._averaged = [b for b in model.buffers() if id(b) in averaged]
        self._buffers = [b for b in model.buffers() if b.numel() and id(b) not in averaged]
        self.loss_fn = loss_fn or nn.CrossEntropyLoss()
        self.compute = compute
        why = compute_unsupported(compute, next(model.parameters()).device)
        if why:
            raise ValueError(f"precision.compute: {why}")
        why = overlap_unsupported(overlap, next(model.parameters()).device)
        if why:
            raise ValueError(why)
        comm_lib.broadcast_module(model, topology.comm)
        sync = comm_lib.create(strategy, model.parameters(), topology, bucket_bytes=int(bucket_mb * 2**20),
                               compression=compression, overlap=overlap, tune=tune,
                               compression_options=compression_options)
        self.grad_sync = comm_lib.with_comm_delay(sync, comm_delay_ms)   # emulated slow link (0: none)
        self.algo = update_lib.create(algorithm, model, optimizer, self.grad_sync, scaler=scaler, timer=self.timer,
                                    **(algorithm_options or {}))
        self.step_count = 0

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed-precision compute context (FP32 master weights stay in the optimiser)."""
        dtype = AUTOCAST_DTYPES[self.compute]
        if dtype is None:
            return contextlib.nullcontext()
        device = next(self.model.parameters()).device.type
        return torch.autocast(device_type=device, dtype=dtype)

    def lr(self) -> float | None:
        return lr_at(self.step_count, self.schedule) if self.schedule is not None else None

    def step(self, x: torch.Tensor, y: torch.Tensor) -> update_lib.StepResult:
        """One training step on this rank's share of the global batch; returns a StepResult."""
        lr = self.lr()
        if lr is not None:
            set_lr(self.optimizer, lr)

        def compute_loss():
            if self.broadcast_buffers == "forward":
                self.sync_buffers()
            with self.autocast():
                return self.loss_fn(self.model(x), y)

        result = self.algo.step(compute_loss)
        self.step_count += 1
        return result

    def sync_buffers(self) -> None:
        """Collective: every rank's buffers (BN running statistics) become rank 0's; the running
        statistics of ghost BatchNorm layers become the ranks' mean (:mod:`hpctrain.models.ghostbn`)."""
        comm_lib.broadcast_tensors(self._buffers, self.topo.comm)
        if self._averaged:
            comm_lib.average_tensors(self._averaged, self.topo.comm)

    def finish(self) -> None:
        """Collective: make every replica identical — complete any update still in flight
        (OD-SGD's pending global step) and take rank 0's buffers. Call before evaluating or
        saving; the checkpointer does."""
        self.algo.finish()
        self.sync_buffers()

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[nn.Module]:
        """Collective: ``with trainer.evaluation(): ...`` scores the same model on every rank
        (:meth:`finish`, then ``model.eval()``; training mode is restored afterwards)."""
        self.finish()
        was_training = self.model.training
        self.model.eval()
        try:
            yield self.model
        finally:
            self.model.train(was_training)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "algorithm": self.algo.state_dict(), "step": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.algo.load_state_dict(state["algorithm"])
        self.step_count = int(state["step"])

    def close(self) -> None:
        """Collective: close what the trainer made - the update algorithm (its hooks on the
        model go) and the gradient sync (its hooks, communicators and windows; each ``p.grad``
        becomes a private copy). A round still in flight is waited for, not applied: call
        :meth:`finish` first to keep OD-SGD's pending update. Idempotent."""
        try:
            self.algo.close()
        finally:
            self.grad_sync.close()
