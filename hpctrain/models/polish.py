"""Final Polishing: re-estimate BatchNorm statistics on un-augmented training data.

Kasagi et al. (HPDC'20) finish training by re-computing BN statistics without data
augmentation; their exact procedure is not public. Ours follows precise-BN (fvcore
``nn/precise_bn.py: update_bn_stats``; torch ``optim/swa_utils.py: update_bn``), with one
deliberate difference so that the result is *exactly* reproducible across any number of
ranks:

* One forward pass per batch, in train mode, without gradients, exactly as precise-BN does:
  every BN layer normalises with its batch's statistics, so the input of a later BN layer is
  the one it sees in training. (Using already-recomputed running stats for earlier layers
  would need one pass per BN layer.)
* A forward pre-hook on every BN layer accumulates, per channel, the sum and the sum of
  squares of the layer's input and the element count, in float64. fvcore averages per-batch
  means and variances and ``update_bn`` keeps a cumulative average of them; both weight
  batches equally and drop the spread between batch means. We keep sums instead, so
* one ``comm.Allreduce(SUM)`` of all layers' sums (a single float64 buffer) combines ranks
  exactly: ``mean = S / N``, ``var = (Q - N * mean**2) / (N - 1)`` (unbiased, as torch stores
  ``running_var``) are the statistics of the BN input over *all* samples on all ranks.

The result equals a single-process run over the same batches (in any order, split across
ranks in any way), up to floating-point summation order. Batch composition still matters,
since train-mode BN normalises each batch with its own statistics: use the training batch
size. The optional "last epochs without augmentation" part of Final Polishing is a data-loader
setting, chosen by the job (hpctrain/job/).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from mpi4py import MPI
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["recompute_bn_stats", "bn_layers"]


def bn_layers(model: nn.Module) -> list[_BatchNorm]:
    """All BatchNorm layers (1d/2d/3d) that track running statistics, in module order."""
    return [m for m in model.modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats]


def _buffers(bn: _BatchNorm) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(running_mean, running_var, num_batches_tracked)``: there in every layer of :func:`bn_layers`."""
    assert bn.running_mean is not None and bn.running_var is not None and bn.num_batches_tracked is not None
    return bn.running_mean, bn.running_var, bn.num_batches_tracked


def _first(batch: Any) -> torch.Tensor:
    return batch[0] if isinstance(batch, (tuple, list)) else batch


@torch.no_grad()
def recompute_bn_stats(model: nn.Module, batches: Iterable[Any], comm: MPI.Comm,
                       inputs_of: Callable[[Any], torch.Tensor] = _first) -> int:
    """Set every BN layer's running mean/var to its input statistics over all ranks' batches.

    ``batches`` yields input tensors or ``(inputs, targets)`` (``inputs_of`` picks the
    input). Every rank of ``comm`` must call this (one collective); a rank may have no
    batches. Returns the global number of samples. Layers that saw fewer than two values
    keep their statistics. Training mode, momentum and ``num_batches_tracked`` are restored.
    """
    layers = bn_layers(model)
    # on each layer's device: the sums stay there and cross to the host once, after the last
    # batch (two copies per layer per batch made the host wait for the device at every layer)
    sums = [torch.zeros(2 * bn.num_features + 1, dtype=torch.float64, device=_buffers(bn)[0].device)
            for bn in layers]

    def make_hook(acc: torch.Tensor, n_ch: int):
        def hook(_module, args):
            x = args[0].detach()
            dims = [0] + list(range(2, x.dim()))
            x64 = x.to(torch.float64)
            acc[:n_ch] += x64.sum(dims)
            acc[n_ch:2 * n_ch] += (x64 * x64).sum(dims)
            acc[2 * n_ch] += x.numel() // n_ch
        return hook

    saved = [(bn.momentum, _buffers(bn)[2].clone()) for bn in layers]
    handles = [bn.register_forward_pre_hook(make_hook(acc, bn.num_features))
               for bn, acc in zip(layers, sums)]
    was_training = model.training
    n_local = 0
    try:
        model.train()
        for batch in batches:
            x = inputs_of(batch)
            model(x)
            n_local += int(x.shape[0])
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
        for bn, (momentum, tracked) in zip(layers, saved):
            bn.momentum = momentum
            _buffers(bn)[2].copy_(tracked)

    on_host = torch.cat([acc.to(sums[0].device) for acc in sums]).cpu() if sums else torch.zeros(0, dtype=torch.float64)
    flat = np.ascontiguousarray(torch.cat([on_host, torch.tensor([float(n_local)], dtype=torch.float64)]).numpy())
    comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    _assign(layers, flat)
    return int(flat[-1])


def _assign(layers: list[_BatchNorm], flat: np.ndarray) -> None:
    """Turn the reduced (sum, sum of squares, count) per layer into running stats."""
    off = 0
    for bn in layers:
        c = bn.num_features
        s, q, n = flat[off:off + c], flat[off + c:off + 2 * c], flat[off + 2 * c]
        off += 2 * c + 1
        if n < 2:
            continue
        mean = s / n
        var = np.maximum((q - n * mean * mean) / (n - 1), 0.0)
        running_mean, running_var, _ = _buffers(bn)
        running_mean.copy_(torch.from_numpy(mean))
        running_var.copy_(torch.from_numpy(var))
