"""lars_update: the LARS momentum step for many tensors in one pass (one launch on GPU).

docs/large-batch.md / You et al. 2017 / MLPerf `lars_optimizer.py`, with the per-tensor step size
`step[t] = lr * lambda_t` computed by the caller from `multi_tensor_sq_norms`:

    u = step[t] * (g + weight_decay * w)
    v = momentum * v + u
    w = w - v                      (nesterov: w = w - u - momentum * v)

The CUDA kernel reads w, g, v once and writes w, v once (5 words per element); the reference
mirrors `hpctrain.optim.lars` (torch `_foreach_*`, no parameter-size temporaries).
"""
import numbers

import numpy as np
import torch

from . import _runtime
from ._prelude import PRELUDE

KERNEL_NAME = "hpc_lars_update"

SOURCE = PRELUDE + r"""
extern "C" __global__ void hpc_lars_update(const hpc_i64* table, int n_tensors,
                                           const hpc_i64* grad_addrs, const hpc_i64* mom_addrs,
                                           const float* step, float step_scalar,
                                           float weight_decay, float momentum, int nesterov) {
    HpcChunk k = hpc_chunk(table, n_tensors, blockIdx.x);
    float* w = (float*)(hpc_u64)table[k.tensor];
    const float* g = (const float*)(hpc_u64)grad_addrs[k.tensor];
    float* v = (float*)(hpc_u64)mom_addrs[k.tensor];
    float s = step != 0 ? step[k.tensor] : step_scalar;
    for (hpc_i64 i = k.begin + threadIdx.x; i < k.end; i += blockDim.x) {
        float wi = w[i];
        float u = s * (g[i] + weight_decay * wi);
        float vi = momentum * v[i] + u;
        v[i] = vi;
        w[i] = nesterov ? wi - u - momentum * vi : wi - vi;
    }
}
"""


def _axpy_(ys, xs, a) -> None:
    """ys += a * xs; `a` a float or a list of 0-d tensors (kept on the device)."""
    if isinstance(a, list):
        torch._foreach_addcmul_(ys, xs, a)
    else:
        torch._foreach_add_(ys, xs, alpha=a)


@torch.no_grad()
def reference(params, grads, momentum_buffers, step, weight_decay, momentum, nesterov=False) -> None:
    """torch reference (any device); updates `params` and `momentum_buffers` in place."""
    if not params:
        return
    if params[0].device.type == "cpu":
        _reference_cpu(params, grads, momentum_buffers, step, weight_decay, momentum, nesterov)
        return
    steps = list(step.unbind(0)) if isinstance(step, torch.Tensor) else float(step)
    torch._foreach_mul_(momentum_buffers, momentum)
    _axpy_(momentum_buffers, grads, steps)
    if weight_decay:
        _axpy_(momentum_buffers, params,
               [weight_decay * s for s in steps] if isinstance(steps, list) else weight_decay * steps)
    if not nesterov:
        torch._foreach_sub_(params, momentum_buffers)
        return
    if weight_decay:  # w*(1 - s*wd) - s*g - m*v  ==  w - u - m*v
        torch._foreach_mul_(params, [1.0 - weight_decay * s for s in steps] if isinstance(steps, list)
                            else 1.0 - weight_decay * steps)
    _axpy_(params, grads, [-s for s in steps] if isinstance(steps, list) else -steps)
    torch._foreach_add_(params, momentum_buffers, alpha=-momentum)


def _reference_cpu(params, grads, bufs, step, weight_decay, momentum, nesterov) -> None:
    """CPU: steps as Python floats (reading them costs no device sync here), so each update is
    an `add_(alpha=float)`, which runs faster than `addcmul_` with a 0-d tensor
    (docs/environment.md)."""
    steps = step.tolist() if isinstance(step, torch.Tensor) else [float(step)] * len(params)
    for w, g, v, s in zip(params, grads, bufs, steps):
        v.mul_(momentum).add_(g, alpha=s)
        if weight_decay:
            v.add_(w, alpha=s * weight_decay)
        if not nesterov:
            w.sub_(v)
            continue
        if weight_decay:
            w.mul_(1.0 - s * weight_decay)
        w.add_(g, alpha=-s).add_(v, alpha=-momentum)


def cuda(params, grads, momentum_buffers, step, weight_decay, momentum, nesterov=False) -> None:
    """One launch for all tensors on the caller's stream."""
    with _runtime.launch_scope(params[0]):
        table, n_chunks = _runtime.device_table(params)
        grad_addrs = _runtime.device_addresses(grads)
        mom_addrs = _runtime.device_addresses(momentum_buffers)
        per_tensor = not isinstance(step, numbers.Real)
        step_ptr = _runtime.ptr_arg(step) if per_tensor else np.uint64(0)
        step_scalar = np.float32(0.0 if per_tensor else step)
        fn = _runtime.function(SOURCE, KERNEL_NAME)
        _runtime.launch(fn, n_chunks, (table, np.int32(len(params)), grad_addrs, mom_addrs,
                                       step_ptr, step_scalar, np.float32(weight_decay),
                                       np.float32(momentum), np.int32(bool(nesterov))))
