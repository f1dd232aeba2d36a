"""Horovod's ``SyncBatchNorm``: batch statistics over the global batch, gradients to match.

Forward: one allreduce of the per-channel sums and the count gives the global mean, a second of
the squared deviations from it gives the variance (two passes: no cancellation of
``E[x^2] - E[x]^2``). Backward: one allreduce of ``sum(dy)`` and ``sum(dy * xhat)`` gives the
gradient of the sum of every rank's loss with respect to this rank's inputs (each rank's output
depends on every rank's inputs through the statistics), as torch's ``SyncBatchNorm`` does; weight
and bias gradients stay local and are averaged with the other gradients. In eval mode, or with
one rank, it is a plain batch norm.
"""
from __future__ import annotations

import torch
from mpi4py import MPI
from torch.nn.modules.batchnorm import _BatchNorm

from hpctrain.horovod.process_sets import state


def _allreduce_sum(t: torch.Tensor) -> torch.Tensor:
    buf = t.detach().to("cpu", torch.float64).contiguous()
    state().comm.Allreduce(MPI.IN_PLACE, buf.numpy(), op=MPI.SUM)
    return buf.to(t.device, t.dtype)


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """(N, C, ...) -> (C, N * ...) so per-channel sums are one reduction."""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for half-precision inputs, else the input's own (fp64 stays fp64, as in torch)."""
    return torch.promote_types(dtype, torch.float32)


class _SyncBN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ct = _compute_dtype(x.dtype)
        xc = _channels_last(x.to(ct))
        local = torch.cat([xc.sum(1), torch.tensor([float(xc.shape[1])], dtype=ct, device=x.device)])
        total = _allreduce_sum(local)
        count = total[-1]
        mean = total[:-1] / count
        var = _allreduce_sum(((xc - mean[:, None]) ** 2).sum(1)) / count
        invstd = torch.rsqrt(var + eps)
        shape = [1, -1] + [1] * (x.dim() - 2)
        xhat = (x.to(ct) - mean.view(shape)) * invstd.view(shape)
        y = xhat * weight.to(ct).view(shape) + bias.to(ct).view(shape) if weight is not None else xhat
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.count = count
        ctx.mark_non_differentiable(mean, var, count)
        return y.to(x.dtype), mean, var, count

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar, _dcount):
        xhat, invstd, weight = ctx.saved_tensors
        ct = xhat.dtype
        dyc, xhc = _channels_last(dy.to(ct)), _channels_last(xhat)
        sum_dy, sum_dy_xhat = dyc.sum(1), (dyc * xhc).sum(1)
        both = _allreduce_sum(torch.cat([sum_dy, sum_dy_xhat]))
        g_dy, g_dy_xhat = both[:sum_dy.numel()], both[sum_dy.numel():]
        shape = [1, -1] + [1] * (dy.dim() - 2)
        w = weight.to(ct) if weight is not None else torch.ones_like(invstd)
        dx = (w * invstd).view(shape) * (dy.to(ct) - (g_dy / ctx.count).view(shape)
                                         - xhat * (g_dy_xhat / ctx.count).view(shape))
        dw = sum_dy_xhat.to(weight.dtype) if weight is not None else None
        db = sum_dy.to(weight.dtype) if weight is not None else None
        return dx.to(dy.dtype), dw, db, None


class SyncBatchNorm(_BatchNorm):
    """``hvd.SyncBatchNorm(num_features, eps=1e-5, momentum=0.1, affine=True,
    track_running_stats=True)`` for inputs of any dimension (N, C, ...)."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or state().topo.size == 1:
            return super().forward(input)
        y, mean, var, count = _SyncBN.apply(input, self.weight, self.bias, self.eps)
        if self.track_running_stats:
            with torch.no_grad():
                # track_running_stats: BatchNorm made these buffers
                assert self.num_batches_tracked is not None and self.running_mean is not None
                assert self.running_var is not None
                self.num_batches_tracked += 1
                m = (1.0 / float(self.num_batches_tracked)) if self.momentum is None else self.momentum
                unbiased = var * (count / max(count - 1, 1))
                self.running_mean.mul_(1 - m).add_(mean.to(self.running_mean.dtype), alpha=m)
                self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
        return y
