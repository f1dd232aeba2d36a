"""Horovod's ``DistributedOptimizer`` on hpctrain's gradient sync.

Gradients are averaged by a :class:`hpctrain.comm.GradSync` - the same buckets and strategies as
:class:`hpctrain.DistributedTrainer` (``auto``: the shared-memory ``hierarchical`` sync where a
node holds several ranks; bucket views, so a step copies no gradient outside the collective;
``Compression.fp16`` is hpctrain's fp16 wire). The reduction runs in :meth:`synchronize` (called
by :meth:`step`), after the whole backward, as the trainer's default does.

It composes rather than impersonates: it holds the user's optimiser and shares its
``param_groups``, ``state`` and ``defaults`` (so lr schedulers, ``GradScaler`` and code that sets
``group["lr"]`` work), and is a ``torch.optim.Optimizer`` for ``isinstance`` checks - but not an
instance of the wrapped class, unlike Horovod's dynamically made subclass.

Horovod's gradient compressors (``compress(t) -> (t', ctx)``, ``decompress(t', ctx)``) act as in
Horovod on tensor collectives; ``DistributedOptimizer`` maps them onto hpctrain's wire codecs
instead (``Compression.fp16`` -> the fp16 wire: pre-divided, fp32 accumulation, only what crosses
the network is compressed; :mod:`hpctrain.comm.compression`).
"""
from __future__ import annotations

import hashlib
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from hpctrain import comm as comm_lib
from hpctrain.comm.buckets import DEFAULT_BUCKET_BYTES
from hpctrain.horovod.coordinator import Sig
from hpctrain.horovod.errors import unsupported
from hpctrain.horovod.process_sets import global_process_set, resolve, state
from hpctrain.horovod.torch import collectives as C


class Compressor:
    """Interface for compressing and decompressing a tensor (Horovod's)."""

    @staticmethod
    def compress(tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    wire = "none"

    @staticmethod
    def compress(tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx) -> torch.Tensor:
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as fp16."""

    wire = "fp16"

    @staticmethod
    def compress(tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx) -> torch.Tensor:
        return tensor.type(ctx) if ctx is not None and ctx.is_floating_point else tensor


class Compression:
    """``Compression.none`` / ``Compression.fp16``, as in Horovod."""

    none = NoneCompressor
    fp16 = FP16Compressor


def _named(optimizer, named_parameters) -> list[tuple[str, torch.Tensor]]:
    """Horovod's checks of ``named_parameters``, with its messages."""
    if named_parameters is None:     # Horovod's automatic names: group and index, unique
        return [(f"allreduce.noname.{i}.{j}", v) for i, g in enumerate(optimizer.param_groups)
                for j, v in enumerate(g["params"])]
    named = list(named_parameters)
    if any(not isinstance(p, tuple) for p in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    seen: set[str] = set()
    dups: set[str] = set()
    for k, _ in named:
        (dups if k in seen else seen).add(k)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         f"Found duplicates: {', '.join(sorted(dups))}")
    ids = {id(v) for g in optimizer.param_groups for v in g["params"]} - {id(v) for _, v in named}
    if ids:
        raise ValueError("named_parameters was specified, but one or more model parameters were not "
                         f"named. Python object ids: {', '.join(str(i) for i in ids)}")
    return named


def _bucket_bytes() -> int:
    """``HOROVOD_FUSION_THRESHOLD`` (bytes) sizes the buckets where set; else hpctrain's 25 MiC."""
    raw = os.environ.get("HOROVOD_FUSION_THRESHOLD", "")
    if raw.strip():
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"HOROVOD_FUSION_THRESHOLD: expected bytes, got {raw!r}") from None
        return max(value, 1)
    return DEFAULT_BUCKET_BYTES


class DistributedOptimizer(torch.optim.Optimizer):
    """``hvd.DistributedOptimizer(optimizer, named_parameters=..., compression=..., ...)``:
    averages gradients over ranks before ``optimizer.step()``."""

    def __init__(self, optimizer, named_parameters=None, compression=Compression.none,
                 backward_passes_per_step=1, op=C.Average, gradient_predivide_factor=1.0,
                 num_groups=0, groups=None, sparse_as_dense=False, process_set=global_process_set):
        if op == C.Adasum:
            raise unsupported("DistributedOptimizer(op=Adasum)", "use op=hvd.Average (the default) "
                              "with a large-batch optimiser (hpctrain.LARS) instead (docs/horovod.md)")
        if op not in (C.Average, C.Sum):
            raise ValueError("hpctrain.horovod: DistributedOptimizer takes op=Average or op=Sum")
        if gradient_predivide_factor != 1.0 and op != C.Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        wire = getattr(compression, "wire", None)
        if wire is None:
            raise unsupported(f"DistributedOptimizer(compression={getattr(compression, '__name__', compression)})",
                              "use hvd.Compression.none or hvd.Compression.fp16")
        if int(backward_passes_per_step) < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        ps = resolve(process_set)
        self._building = True
        torch.optim.Optimizer.__init__(self, [{"params": []}], optimizer.defaults)
        self._building = False
        self._inner = optimizer
        self.param_groups, self.state = optimizer.param_groups, optimizer.state
        named = _named(optimizer, named_parameters)
        self._names = {id(v): k for k, v in named}
        self._parameter_names = {v: k for k, v in named}     # Horovod's attribute: param -> name
        self._params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        st = state()
        self._ps = ps
        n = ps.counters["optimizer"] = ps.counters.get("optimizer", -1) + 1
        self._id = f"optimizer.{ps.process_set_id}.{n}"      # same on every member of the set
        # The gradient path is agreed once: its buckets never change afterwards.
        layout = repr([(self._names.get(id(p)), tuple(p.shape), str(p.dtype)) for p in self._params])
        ps.agree(Sig("optimizer", self._id, shape=(hashlib.sha1(layout.encode()).hexdigest()[:12],),
                     op=f"{C.OP_NAMES[op]}/{wire}"))
        topo = st.topo if ps.process_set_id == 0 else ps.topology()
        self._sync = comm_lib.create(os.environ.get("HPCTRAIN_STRATEGY", "auto"), self._params, topo,
                                     bucket_bytes=_bucket_bytes(), compression=wire, tune="measure")
        if op == C.Sum:
            self._sync.gather_scale = 1.0       # the sum, not the mean
        self._passes = {id(p): 0 for p in self._params}
        self._hooks = [p.register_post_accumulate_grad_hook(self._counted) for p in self._params]
        self._synchronized, self._should_synchronize = False, True
        self._registry = st.optimizers
        self._registry[self._id] = self
        if topo.rank == 0:
            grouped = " (num_groups/groups: fused by bucket size instead)" if num_groups or groups else ""
            sys.stderr.write(f"hpctrain.horovod: gradients by {self._sync.describe()}{grouped}\n")

    def add_param_group(self, param_group) -> None:
        if getattr(self, "_building", False):
            return super().add_param_group(param_group)
        raise ValueError("hpctrain.horovod: add parameter groups to the optimizer before wrapping it "
                         "in DistributedOptimizer (their gradients would not be averaged)")

    def _counted(self, p) -> None:
        """After each backward's accumulation into ``p.grad``: Horovod's pass count check."""
        if p.grad is not None and p.grad.is_sparse:
            p.grad = p.grad.to_dense()          # sparse gradients travel dense (sparse_as_dense)
        n = self._passes[id(p)] = self._passes[id(p)] + 1
        if n > self.backward_passes_per_step:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times "
                                 "before call to step(). Increase backward_passes_per_step to "
                                 "accumulate gradients locally.")

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = int(passes)
        self._passes = dict.fromkeys(self._passes, 0)

    def synchronize(self) -> None:
        """Average every gradient over ranks now (collective); ``p.grad`` holds the mean."""
        if self._sync.closed:
            raise RuntimeError("hpctrain.horovod: DistributedOptimizer used after hvd.shutdown()")
        self._ps.agree(Sig("grad", self._id))
        self._sync.finish(scatter=True, check=False)    # Horovod has no overflow flag: none read
        self._passes = dict.fromkeys(self._passes, 0)
        self._synchronized = True

    def mirror_round(self) -> None:
        """A joined rank's part in the others' gradient round: zero gradients."""
        for p in self._params:
            p.grad = None
        self._sync.finish(scatter=True, check=False)

    def skip_synchronize(self) -> _SkipSynchronize:
        """``with optimizer.skip_synchronize(): optimizer.step()`` after an explicit
        :meth:`synchronize` (e.g. to clip or unscale the averaged gradients first)."""
        return _SkipSynchronize(self)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]  # torch's overloads split by closure
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context "
                              "after optimizer.synchronize(). This can cause training slowdown. You may "
                              "want to consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return self._inner.step(closure) if closure is not None else self._inner.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        if any(self._passes.values()):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as "
                                 "it can cause a race condition.")
        self._inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self._inner.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self._passes = dict.fromkeys(self._passes, 0)
        self._synchronized, self._should_synchronize = False, True
        self._inner.load_state_dict(state_dict)
        # torch replaces the optimizer's param_groups and state with new objects: share those
        self.param_groups, self.state = self._inner.param_groups, self._inner.state

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._inner!r})"

    def close(self) -> None:
        """Remove the hooks and free the gradient sync (collective; ``hvd.shutdown`` calls it)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._sync.close()
        self._registry.pop(self._id, None)


class _SkipSynchronize:
    def __init__(self, opt: DistributedOptimizer):
        self.opt = opt

    def __enter__(self):
        self.opt._should_synchronize = False

    def __exit__(self, *exc):
        self.opt._should_synchronize = True
