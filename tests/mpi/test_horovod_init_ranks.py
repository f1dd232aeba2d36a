"""``hvd.init(comm=[ranks])``: Horovod on some ranks of the world only (the others never call
it); ``init(process_sets=[...])`` registers sets at start-up."""
import pytest
import torch
from mpi4py import MPI

import hpctrain.horovod.torch as hvd

pytestmark = pytest.mark.mpi


def test_init_on_a_list_of_ranks_and_with_process_sets():
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    chosen = sorted({0, size - 1})
    if rank in chosen:
        first = hvd.ProcessSet([0])         # (at one rank it would be the job itself)
        hvd.init(comm=chosen, process_sets=[first] if size > 1 else [])
        try:
            assert hvd.size() == len(chosen) and hvd.rank() == chosen.index(rank)
            assert hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum).item() == sum(chosen)
            if hvd.rank() == 0 and size > 1:
                assert first.included() and first.process_set_id == 1
                assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=first).item() == 1.0
        finally:
            hvd.shutdown()
        assert not first.included() and not hvd.is_initialized()        # sets freed too
    else:
        with pytest.raises(ValueError, match="not in the list"):
            hvd.init(comm=chosen)
    MPI.COMM_WORLD.Barrier()
