"""Ghost BatchNorm: training statistics over fixed groups of ``G`` consecutive samples.

Plain BatchNorm normalises each rank's local batch by that batch's own statistics, so the forward
pass, and with it the whole run, depends on how many ranks the global batch is split over. With
``model.bn_group = G`` every :class:`~torch.nn.modules.batchnorm._BatchNorm` layer normalises
each group of ``G`` consecutive samples of the global batch by the group's statistics (Hoffer et
al. 2017, "Train longer, generalize better"; Goyal et al. 2017 used 32 samples per worker): a
rank holding whole groups computes exactly what one process with the global batch computes for
them, at any rank count whose local batch ``G`` divides.

The running statistics are the average over groups of each group's mean and unbiased variance,
updated once per step; they are linear in the groups' statistics, so averaging the ranks' running
statistics (the trainer does, :func:`averaged_buffers`) gives one process's values. Evaluation
uses the running statistics, as plain BatchNorm does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


class GhostBatchNorm(_BatchNorm):
    """Marks a BatchNorm layer whose training statistics are taken over groups of ``bn_group``
    samples (:func:`use_bn_groups` gives the layer a subclass of its own class and this one)."""
    bn_group: int = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ghost_forward(self, self.bn_group, x)


_CLASSES: dict[type, type] = {}


def _ghost_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Ghost{cls.__name__}", (GhostBatchNorm, cls), {"__module__": __name__})
    return _CLASSES[cls]


def _ghost_forward(bn: _BatchNorm, group: int, x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    if not bn.training or n <= group:              # evaluation, or at most one group: plain BatchNorm
        return _plain_forward(bn, x)
    if n % group:
        raise ValueError(f"model.bn_group = {group}: does not divide the batch of {n} samples")
    m, c, rest = n // group, x.shape[1], x.shape[2:]
    # (m groups, G, C, ...) -> (G, m*C, ...): each (group, channel) a "channel" of one batch_norm call
    xr = x.reshape(m, group, c, *rest).transpose(0, 1).reshape(group, m * c, *rest)
    y = F.batch_norm(xr, None, None, None, None, True, 0.0, bn.eps)
    y = y.reshape(group, m, c, *rest).transpose(0, 1).reshape(x.shape)
    shape = (1, c) + (1,) * len(rest)
    if bn.affine:
        y = y * bn.weight.view(shape) + bn.bias.view(shape)
    if bn.track_running_stats and bn.running_mean is not None and bn.running_var is not None:
        with torch.no_grad():
            dims = [0] + list(range(2, xr.dim()))
            mean = xr.mean(dims).view(m, c).mean(0)
            var = xr.var(dims, unbiased=True).view(m, c).mean(0)
            assert bn.num_batches_tracked is not None
            bn.num_batches_tracked.add_(1)
            factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
            bn.running_mean.mul_(1 - factor).add_(mean.to(bn.running_mean.dtype), alpha=factor)
            bn.running_var.mul_(1 - factor).add_(var.to(bn.running_var.dtype), alpha=factor)
    return y


def _plain_forward(bn: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    plain: type[nn.Module] = type(bn).__mro__[2]    # the layer's own class, past Ghost* and GhostBatchNorm
    return plain.forward(bn, x)


def use_bn_groups(model: nn.Module, group: int) -> int:
    """Make every BatchNorm layer of ``model`` take its training statistics over groups of
    ``group`` samples; returns how many layers it changed (0: the model has none)."""
    layers = [mod for mod in model.modules() if isinstance(mod, _BatchNorm)]
    for bn in layers:
        if not isinstance(bn, GhostBatchNorm):
            bn.__class__ = _ghost_class(type(bn))
        bn.bn_group = group                                           # type: ignore[assignment]
    return len(layers)


def averaged_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The running statistics of ``model``'s ghost BatchNorm layers: what the ranks average (and do
    not take from rank 0) to keep one process's values."""
    out: list[torch.Tensor] = []
    for mod in model.modules():
        if isinstance(mod, GhostBatchNorm) and mod.bn_group:
            out += [t for t in (mod.running_mean, mod.running_var) if t is not None]
    return out


def group_problem(group: int, global_batch: int, ranks: int) -> str | None:
    """Why ``model.bn_group = group`` cannot run at ``ranks`` ranks (None: it can): each rank must
    hold whole groups of its local batch, or its groups would differ from one process's."""
    local = global_batch // ranks
    if group and local % group:
        return (f"{group} does not divide the local batch of {local} samples "
                f"(train.batch_size {global_batch} over {ranks} ranks); run on a rank count whose local batch "
                f"it divides, or set a group that divides {local}")
    return None


def rank_dependent_norm(model: nn.Module) -> bool:
    """Whether ``model`` has a BatchNorm layer that normalises by each rank's local batch (not a
    ghost one): its run then depends on the rank count."""
    return any(isinstance(mod, _BatchNorm) and not (isinstance(mod, GhostBatchNorm) and mod.bn_group)
               for mod in model.modules())
