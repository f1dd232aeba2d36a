"""The worked example of a codec plugin (examples/plugins/bf16_codec.py, docs/development.md):
chosen by ``module:name`` from the command line, it packs, sums and unpacks as torch's own
bfloat16 arithmetic does, and a strategy's mean through it equals MPI's Allreduce within
bfloat16's bound: (n + 1) 2^-8 S per element (S = mean |g| over ranks; one rounding of each
pre-divided gradient and one per ring hop of a partial sum; bf16 keeps fp32's range, so no
subnormal term is needed at these magnitudes)."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.job.args import config_from_args
from hpctrain.job.config import validate
from hpctrain.topology import Topology

pytestmark = pytest.mark.usefixtures("plugin_sandbox")   # registrations undone after each test
NAME = "examples.plugins.bf16_codec:bf16"
BF16 = torch.bfloat16


@pytest.mark.mpi
def test_selected_by_name_from_the_command_line():
    validate(config_from_args(["--set", f"comm.compression={NAME}", "--run-dir", "/nonexistent/run"]))
    assert comm_lib.compression.get(NAME).name == "bf16" and "bf16" in comm_lib.COMPRESSIONS


@pytest.mark.mpi
def test_pack_reduce_unpack_equal_torch_bfloat16():
    codec, scale = comm_lib.compression.get(NAME), 0.1
    rng = np.random.default_rng(MPI.COMM_WORLD.Get_rank())
    a = [torch.from_numpy(rng.standard_normal(n).astype(np.float32) * 1e30) for n in (3, 70000, 5)]
    b = [torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for n in (3, 70000, 5)]
    n = sum(t.numel() for t in a)
    wa, wb = codec.wire_buffer(n), codec.wire_buffer(n)
    codec.pack(a, wa, scale)
    codec.pack(b, wb, scale)
    want_a, want_b = (torch.cat(a).double() * scale).float().to(BF16), (torch.cat(b) * scale).to(BF16)
    assert wa.dtype == BF16 and torch.equal(wa, want_a) and torch.equal(wb, want_b)
    dst = torch.empty_like(wa)
    assert codec.reduce(dst, wb, codec.scratch(n), check=True, src=wa, scale=0.5) is False   # 1e30: no overflow
    want = ((want_a.float() + want_b.float()) * 0.5).to(BF16)
    assert torch.equal(dst, want)
    outs = [torch.empty(t.numel()) for t in a]
    codec.unpack(dst, outs)
    assert torch.equal(torch.cat(outs), want.float())
    bad = wb.clone()
    bad[70001] = float("inf")
    assert codec.reduce(wa.clone(), bad, codec.scratch(n), check=True) is True
    with pytest.raises(ValueError, match="comm.compression: bf16 needs float32"):
        codec.check_dtype(torch.float64)


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", comm_lib.concrete())
def test_strategy_mean_matches_mpi_allreduce(strategy, closer):
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    topo = closer(Topology.create(comm, ranks_per_node=1))        # every rank a node: the wire is used
    sizes = [3, 70001, 20000, 5]
    params = [torch.nn.Parameter(torch.zeros(k)) for k in sizes]
    sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=1 << 20, compression=NAME))
    if strategy == "flat" and n > 1:                           # hierarchical packs per slice
        assert any(b.packed is not None and b.codec.name == "bf16" for b in sync.buckets)
    rng = np.random.default_rng(comm.Get_rank())
    grads = [torch.from_numpy((rng.standard_normal(k) * 3).astype(np.float32)) for k in sizes]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    assert sync.allreduce_grads() is False
    for p, g in zip(params, grads):
        want, mean_abs = g.double().numpy(), np.abs(g.double().numpy())
        comm.Allreduce(MPI.IN_PLACE, want)
        comm.Allreduce(MPI.IN_PLACE, mean_abs)
        err = np.abs(p.grad.double().numpy() - want / n)
        assert np.all(err <= (n + 1) * 2.0**-8 * mean_abs / n), float(err.max())
