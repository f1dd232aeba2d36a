"""``optim.name = "sgd"`` takes torch's fused kernel where it runs, with the same bits as torch's
per-parameter loop (the reference: ``foreach=False``)."""
from __future__ import annotations

import torch

from hpctrain.optim import make_optimizer
from hpctrain.optim.sgd import fused_ok


def params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(64, 33)), torch.nn.Parameter(torch.randn(33))]


def test_cpu_sgd_is_fused_and_bit_identical_to_the_loop():
    a, b = params(), params()
    opt = make_optimizer(a, "sgd", lr=0.05, momentum=0.9, weight_decay=1e-4, nesterov=True, exclude_1d=True)
    ref = torch.optim.SGD([{"params": [b[0]]}, {"params": [b[1]], "weight_decay": 0.0}], lr=0.05, momentum=0.9,
                          weight_decay=1e-4, nesterov=True, foreach=False)
    assert all(g["fused"] for g in opt.param_groups)
    gen = torch.Generator().manual_seed(2)
    for _ in range(4):
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_fused_only_where_torch_has_the_kernel():
    assert fused_ok(params())
    assert not fused_ok([torch.nn.Parameter(torch.zeros(3, device="meta"))])
    assert not fused_ok([torch.zeros(3, dtype=torch.int64)])
    assert not fused_ok([])
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(3, device="meta"))], "sgd", lr=0.1, exclude_1d=False)
    assert not opt.param_groups[0]["fused"]
