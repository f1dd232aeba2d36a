"""channels_last parameters get channels_last gradient views in the buckets (issue 34, N5).

DDP makes each bucket view with its parameter's strides; so do the buckets here. Checked: after
a sync every ``p.grad`` of a channels_last parameter has the parameter's strides and lives in
its bucket, the means equal those of the same model laid out contiguously (within rounding: the
convolutions of the two layouts sum in other orders; fp16 within its wire's rounding), for
every strategy, codec and overlap, and LARS's kernel path takes weight and gradient as they are. Expectations:
the contiguous model's means (themselves checked against MPI's Allreduce in
test_comm_grad_views.py)."""
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.optim import LARS
from hpctrain.topology import Topology

pytestmark = pytest.mark.mpi


def conv_net(channels_last: bool):
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1),
                              torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
    return net.to(memory_format=torch.channels_last) if channels_last else net


def grads_after(strategy, codec, overlap, channels_last, topo, closer, rounds=2):
    net = conv_net(channels_last)
    sync = closer(comm_lib.create(strategy, net.parameters(), topo, bucket_bytes=2048,
                                  compression=codec, overlap=overlap))
    g = torch.Generator().manual_seed(20 + topo.comm.Get_rank())
    for _ in range(rounds):
        x = torch.randn(2, 3, 8, 8, generator=g)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        net(x).square().sum().backward()
        sync.allreduce_grads()
    return net, sync


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("codec", ["none", "fp16"])
@pytest.mark.parametrize("strategy", ["flat", "hierarchical"])     # "auto" picks one of them
def test_channels_last_grads_are_strided_bucket_views_with_the_same_means(strategy, codec, overlap, closer):
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=1))
    plain, _ = grads_after(strategy, codec, overlap, False, topo, closer)
    net, sync = grads_after(strategy, codec, overlap, True, topo, closer)
    homes = {b.data_ptr() for bucket in sync.buckets for b in bucket.bufs}
    for p, q in zip(net.parameters(), plain.parameters()):
        real = [i for i, n in enumerate(p.shape) if n != 1]     # a size-1 dimension's stride is moot
        assert [p.grad.stride(i) for i in real] == [p.stride(i) for i in real], (p.shape, p.grad.stride(), p.stride())
        assert p.grad.untyped_storage().data_ptr() in homes
        tol = dict(rtol=2e-3, atol=1e-3) if codec == "fp16" else dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p.grad.contiguous(), q.grad, **tol, msg=f"{strategy} {codec} {p.shape}")
    conv = net[0].weight
    assert not conv.is_contiguous() and conv.grad.is_contiguous(memory_format=torch.channels_last)


def test_lars_kernel_path_takes_channels_last_weights_and_grads(closer):
    """fused_update=True runs kernels.lars_update (its CPU reference here) when weight,
    gradient and momentum are laid out alike; before the strided views a channels_last
    weight met a contiguous gradient and the kernel path refused it."""
    topo = closer(Topology.create(MPI.COMM_WORLD))
    net, _ = grads_after("flat", "none", False, True, topo, closer, rounds=1)
    params = [p for p in net.parameters() if p.ndim > 1]
    opt = LARS(params, lr=0.1, fused_update=True)
    assert opt._use_kernel(params, [p.grad for p in params])
    plain, _ = grads_after("flat", "none", False, False, topo, closer, rounds=1)
    ref = LARS([p for p in plain.parameters() if p.ndim > 1], lr=0.1, fused_update=False)
    for _ in range(2):
        opt.step()
        ref.step()
    for p, q in zip(params, ref.param_groups[0]["params"]):
        torch.testing.assert_close(p.contiguous(), q, rtol=1e-6, atol=1e-7)
