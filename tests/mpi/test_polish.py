"""Final Polishing: BN statistics recomputed over ranks equal the single-process statistics.

Serial test: ``pytest tests/mpi/test_polish.py`` (COMM_SELF). MPI test:
``mpiexec -n 2 .venv/bin/python -m pytest --only-mpi --color=no tests/mpi/test_polish.py``.
"""
import copy

import pytest
import torch
from mpi4py import MPI
from torch import nn

from hpctrain.models.polish import bn_layers, recompute_bn_stats

torch.set_num_threads(1)


def small_model():
    torch.manual_seed(1234)                       # identical replica on every rank
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 5, 3, stride=2, padding=1), nn.BatchNorm2d(5), nn.ReLU(),
        nn.Flatten(), nn.Linear(5 * 3 * 3, 6), nn.BatchNorm1d(6))


def global_batches(n_batches=5, batch=4):
    g = torch.Generator().manual_seed(99)
    return [(torch.randn(batch, 3, 6, 6, generator=g) * (1 + k) + k,
             torch.zeros(batch, dtype=torch.long)) for k in range(n_batches)]


def reference_stats(model, batches):
    """Independent: keep every BN input, concatenate, and use torch's mean / var."""
    model = copy.deepcopy(model).train()
    seen = {i: [] for i, _ in enumerate(bn_layers(model))}
    hooks = [bn.register_forward_pre_hook(
        lambda m, a, i=i: seen[i].append(a[0].transpose(0, 1).reshape(a[0].shape[1], -1)))
        for i, bn in enumerate(bn_layers(model))]
    with torch.no_grad():
        for x, _ in batches:
            model(x)
    for h in hooks:
        h.remove()
    out = []
    for i in seen:
        allx = torch.cat(seen[i], dim=1).double()
        out.append((allx.mean(1), allx.var(1, unbiased=True)))
    return out


def check(model, batches_all):
    ref = reference_stats(model, batches_all)
    for bn, (mean, var) in zip(bn_layers(model), ref):
        torch.testing.assert_close(bn.running_mean.double(), mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bn.running_var.double(), var, rtol=1e-5, atol=1e-5)


def test_serial_single_batch_equals_torch_batchnorm():
    """One batch: our stats equal what torch's own BN stores with momentum=1 (COMM_SELF)."""
    model = small_model()
    x = global_batches(1, 16)[0][0]
    torch_bn = copy.deepcopy(model)
    for bn in bn_layers(torch_bn):
        bn.momentum = 1.0
    with torch.no_grad():
        torch_bn.train()(x)
    model.eval()
    assert recompute_bn_stats(model, [x], MPI.COMM_SELF) == 16
    assert not model.training
    for ours, theirs in zip(bn_layers(model), bn_layers(torch_bn)):
        torch.testing.assert_close(ours.running_mean, theirs.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.running_var, theirs.running_var, rtol=1e-5, atol=1e-6)
        assert ours.momentum == 0.1 and ours.num_batches_tracked.item() == 0


def test_serial_many_batches_pools_all_samples():
    model = small_model()
    batches = global_batches()
    assert recompute_bn_stats(model, batches, MPI.COMM_SELF) == 20
    check(model, batches)


@pytest.mark.mpi(min_size=2)
def test_split_over_ranks_equals_single_process():
    comm = MPI.COMM_WORLD
    batches = global_batches(n_batches=2 * comm.size + 1)       # uneven split on purpose
    mine = batches[comm.rank::comm.size]
    model = small_model()
    for _ in range(2):                                          # a repeated collective agrees
        assert recompute_bn_stats(model, mine, comm) == 4 * len(batches)
        check(model, batches)
    # every rank holds the same statistics (compare against rank 0's by MPI itself)
    flat = torch.cat([torch.cat([bn.running_mean, bn.running_var])
                      for bn in bn_layers(model)]).numpy()
    root = comm.bcast(flat, root=0)
    assert (root == flat).all()
