"""Host syncs per training step at more than one rank, counted on CPU stand-ins
(``tests/host_syncs.py``; the one-rank counts: ``tests/unit/test_host_syncs.py``).

What the algorithm needs at n ranks, and nothing else: MPI reads host memory (staged) or
memory a kernel wrote (a CUDA-aware MPI), so each bucket waits for its own copy's or
backward's event before its reduction; every rank must stop at the same step, so the weight
check's flag is read at the next step after waiting for its own event (not the stream). The
overflow flag is read only where a loss scaler needs it (once per step).
"""
import pytest
import torch
from mpi4py import MPI

from hpctrain.topology import Topology
from tests.host_syncs import reference, syncs_per_step

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
@pytest.mark.parametrize("cuda_aware", [False, True])
@pytest.mark.parametrize("scaler", [False, True])
def test_host_syncs_per_step(compute, cuda_aware, scaler, monkeypatch, closer):
    if MPI.COMM_WORLD.Get_size() == 1 and not cuda_aware:
        pytest.skip("a GPU at one rank never stages (its buckets stay on the device)")
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=1))
    count, net, tr = syncs_per_step(monkeypatch, topo, compute, scaler=scaler, cuda_aware=cuda_aware, closer=closer)
    n_buckets = len(tr.grad_sync.buckets)
    if topo.comm.Get_size() == 1:
        assert count == int(scaler)
    elif cuda_aware:    # each bucket's backward event, the weight flag's event, the scaler's read
        assert count == n_buckets + 1 + int(scaler), count
    else:               # each bucket's copy event, the weight flag's (flags are host values here)
        assert count == n_buckets + 1, count
    counts = topo.comm.allgather(count)
    assert len(set(counts)) == 1
    if not scaler:      # the scaler's first steps may skip (overflow at 2**16 is not expected here)
        want = reference(compute)
        for p, q in zip(net.parameters(), want.parameters()):
            torch.testing.assert_close(p, q)
