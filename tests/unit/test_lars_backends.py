"""LARS on a device without CuPy: torch's multi-tensor norm, no per-tensor scalar work it does
not use, and the backend that ran reported (``LARS.ran``, what gpu-check's LARS row quotes).

No GPU here: ``meta`` tensors stand in for a device the kernels do not run on (CuPy cannot, so
``kernels.backend()`` says "cpu"); they carry shapes and strides but no values, which is all
these routing checks need. The values of both paths are checked against NumPy in
``tests/unit/test_lars.py``.
"""
import pytest
import torch

from hpctrain import kernels
from hpctrain.optim.lars import LARS


def params_on(device, channels_last=True):
    shapes = [(8, 4, 3, 3), (16, 8), (8,)]
    ps = [torch.nn.Parameter(torch.ones(s, device=device)) for s in shapes]
    if channels_last:
        ps[0].data = ps[0].data.to(memory_format=torch.channels_last)
    for p in ps:
        p.grad = torch.ones_like(p)
    return ps


def test_device_tensors_without_cupy_take_foreach_norm(monkeypatch):
    """Before: the kernels' torch reference ran on the device, a dot and a reshape per tensor."""
    monkeypatch.setattr(kernels, "backend", lambda: ("cpu", "no CuPy (test)"))
    sq_norms, foreach, reshapes = [], [], []
    real_sq, real_fe, real_reshape = kernels.multi_tensor_sq_norms, torch._foreach_norm, torch.Tensor.reshape
    monkeypatch.setattr(kernels, "multi_tensor_sq_norms", lambda t: sq_norms.append(len(t)) or real_sq(t))
    monkeypatch.setattr(torch, "_foreach_norm", lambda t, *a: foreach.append(len(t)) or real_fe(t, *a))
    ps = params_on("meta")
    opt = LARS(ps, lr=0.1, weight_decay=1e-4)
    monkeypatch.setattr(torch.Tensor, "reshape", lambda self, *a: reshapes.append(a) or real_reshape(self, *a))
    opt.step()
    assert sq_norms == [] and foreach == [4]        # weights and grads of the 2 adapted tensors
    assert reshapes == []
    assert opt.ran == {"norms": "torch._foreach_norm", "update": "torch._foreach"}


def test_cpu_tensors_keep_the_kernels_norms(monkeypatch):
    opt = LARS(params_on("cpu"), lr=0.1, weight_decay=1e-4)
    assert opt.ran == {"norms": "none", "update": "none"}
    opt.step()
    assert opt.ran == {"norms": "kernels.multi_tensor_sq_norms", "update": "torch._foreach"}


def test_ran_names_the_fused_kernel_where_it_ran():
    ps = params_on("cpu", channels_last=False)
    opt = LARS([{"params": ps[:2]}, {"params": ps[2:], "momentum": 0.0}], lr=0.1, fused_update=True)
    opt.step()      # the momentum group by the kernel (its CPU reference), the other by _foreach
    assert opt.ran["update"] == "kernels.lars_update+torch._foreach"


@pytest.mark.parametrize("nesterov", [False, True])
def test_per_tensor_negations_and_shrinks_only_where_used(nesterov, monkeypatch):
    """Momentum without Nesterov uses neither -step nor 1 - wd*step: before, both lists of
    0-d tensors (a small kernel each on a GPU) were built for every group anyway."""
    ps = params_on("cpu")
    opt = LARS(ps, lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=nesterov, fused_update=False)
    made = []
    for name in ("__neg__", "__rsub__"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _r=real, _n=name: made.append(_n) or _r(self, *a))
    opt.step()
    assert (len(made) > 0) is nesterov
