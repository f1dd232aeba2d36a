"""The node-sum microbenchmark: every variant timed on every repeat, the same figures on every
rank (the slowest rank's), the window freed, and the strategy's sum left correct in the window."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain.comm.window import SharedWindow, aligned
from hpctrain.tools.bench import node_sum


@pytest.mark.mpi
def test_every_variant_is_timed_alike_on_every_rank():
    intra = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        times = node_sum.run(intra, 1001, 3)
        assert set(times) == {"copy", "sum", "sum@1M", "no-check", "no-push", "add", "read-own", "read-other"}
        for by_clock in times.values():
            assert set(by_clock) == {"wall", "cpu"}
            assert all(len(v) == 3 and min(v) >= 0 for v in by_clock.values())
        assert intra.allgather(times) == [times] * intra.Get_size()
        text = node_sum.format_times(times, 1001, intra.Get_size())
        assert all(f"\n{name} " in text for name in times)
    finally:
        intra.Free()


@pytest.mark.mpi
def test_extra_chunk_sizes_are_variants_of_their_own():
    intra = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        times = node_sum.run(intra, 1001, 2, chunks=(100, 7))
        assert {"sum@100", "sum@7"} <= set(times) and len(times) == 10
    finally:
        intra.Free()


@pytest.mark.mpi
@pytest.mark.parametrize("variant", ["sum", "sum@100"])
def test_the_timed_sum_is_the_mean_of_the_inputs(variant):
    intra = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    n, me, n_elems = intra.Get_size(), intra.Get_rank(), 1001
    nb = aligned(n_elems * 4)
    win = SharedWindow(intra, 2 * nb)
    try:
        ins = [win.view(r, 0, n_elems, torch.float32) for r in range(n)]
        outs = [win.view(r, nb, n_elems, torch.float32) for r in range(n)]
        ins[me].copy_(torch.randn(n_elems, generator=torch.Generator().manual_seed(me)))
        for call in (None, node_sum.variants(ins, outs, me, n_elems, chunks=(100,))[variant]):
            if call is not None:
                call()
            win.sync()
            intra.Barrier()
            win.sync()
        want = np.empty(n_elems, np.float32)
        intra.Allreduce(ins[me].numpy(), want, op=MPI.SUM)     # MPI's own sum, then the mean
        got = outs[me].numpy().copy()
        del ins, outs
    finally:
        win.free()
        intra.Free()
    if n == 2:      # one add: the same bits whatever the order
        np.testing.assert_array_equal(got, want * np.float32(0.5))
    else:
        np.testing.assert_allclose(got, want / np.float32(n), rtol=1e-5, atol=1e-6)
