"""A bucket owns its wire: made with the bucket, read-only to strategies, never replaced, and
a compressed round through it still equals MPI's own mean."""
import sys

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.comm.buckets import Bucket
from hpctrain.topology import Topology

SIZES = [5, 30000, 7]       # 120 KB of fp32: one bucket, above the small-message path


def set_from_outside(monkeypatch) -> list:
    """Record every bucket attribute assigned by code outside ``hpctrain.comm.buckets``."""
    seen = []
    real = object.__setattr__

    def spy(self, name, value):
        caller = sys._getframe(1).f_globals.get("__name__")
        if caller != "hpctrain.comm.buckets":
            seen.append((caller, name))
        real(self, name, value)

    monkeypatch.setattr(Bucket, "__setattr__", spy)
    return seen


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", ["flat", "hierarchical"])
def test_strategies_reduce_through_the_bucket_wire_without_setting_it(strategy, monkeypatch, closer):
    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    topo = closer(Topology.create(comm, ranks_per_node=1))      # n nodes: the wire crosses them
    params = [torch.nn.Parameter(torch.zeros(k)) for k in SIZES]
    sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=1 << 20, compression="fp16"))
    (b,) = sync.buckets
    wire, buf = b.wire, b.wire.buf
    if n > 1:               # one rank sends nothing: full precision
        assert b.codec.name == "fp16" and buf is not None and buf.dtype == torch.float16
        # flat: the whole bucket travels packed; hierarchical: this rank's slice across nodes
        assert (b.packed is buf) if strategy == "flat" else (b.packed is None)
    for field in ("packed", "codec"):
        with pytest.raises(AttributeError):
            setattr(b, field, None)
    rng = np.random.default_rng(r)
    seen = set_from_outside(monkeypatch)
    for _ in range(2):
        grads = [rng.standard_normal(k).astype(np.float32) for k in SIZES]
        for p, g in zip(params, grads):
            p.grad = torch.from_numpy(g.copy())
        assert sync.allreduce_grads() is False
    sync.close()                # collective; p.grad become private copies of the means
    monkeypatch.undo()
    assert seen == [], "strategies assigned bucket fields"
    assert b.wire is wire and b.wire.buf is buf
    for p, g in zip(params, grads):
        mean = np.empty_like(g, dtype=np.float64)
        comm.Allreduce(g.astype(np.float64), mean, op=MPI.SUM)
        mean /= n
        tol = (n + 1) * 2.0**-11 * np.abs(mean).max() + 1e-6
        np.testing.assert_allclose(p.grad.double().numpy(), mean, rtol=0, atol=tol)
