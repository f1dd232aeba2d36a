"""Horovod's duplicate-name test as Horovod 0.28.1 runs it: rank 0 leaves a named
``allreduce_async`` pending (its duplicates refused), everyone meets at ``barrier``, then the
other ranks do the same, and a second barrier. Under Horovod the pending allreduce simply never
completes; the barriers are not mismatches. Every other difference is still one (below)."""
import pytest
import torch

import hpctrain.horovod.torch as hvd
from tests.mpi.horovod_session import hvd_on, world  # noqa: F401  (hvd_on: autouse fixture)

pytestmark = pytest.mark.mpi


def goes_on():
    rank, size = world()
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist() == [size] * 2
    assert hvd.allgather(torch.full((1,), rank)).tolist() == list(range(size))


def leave_pending(name):
    """Submit ``name`` and try it ten times more: each duplicate is refused on this rank."""
    handle = hvd.allreduce_async(torch.ones(17, 17, 17), name=name)
    for _ in range(10):
        with pytest.raises(ValueError, match="same name"):
            hvd.allreduce_async(torch.ones(17, 17, 17), name=name)
    return handle


@pytest.mark.timeout(60)
def test_a_pending_named_allreduce_does_not_turn_the_barrier_into_a_mismatch():
    rank, size = world()
    if size == 1:
        pytest.skip("needs a rank that does not submit")
    handles = []
    if rank == 0:
        handles.append(leave_pending("duplicate_name"))
    hvd.barrier()
    if rank > 0:
        handles.append(leave_pending("duplicate_name"))
    hvd.barrier()
    (handle,) = handles
    assert not hvd.poll(handle)                      # pending for good
    with pytest.raises(RuntimeError, match="'duplicate_name' was left pending") as e:
        hvd.synchronize(handle)                      # Horovod would wait for ever: one line instead
    assert isinstance(e.value, hvd.HorovodInternalError) and "\n" not in str(e.value)
    hvd.synchronize(hvd.allreduce_async(torch.ones(3), name="duplicate_name"))   # the name is free again
    goes_on()


CALLS = {   # rank 0's call / the other ranks' call
    "blocking_vs_barrier": (lambda: hvd.allreduce(torch.ones(3), name="blocking"), hvd.barrier),
    "async_vs_other_name": (lambda: hvd.allreduce_async(torch.ones(3), name="a"),
                            lambda: hvd.allreduce(torch.ones(3), name="b")),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CALLS)
def test_every_other_difference_is_still_a_mismatch(case):
    rank, size = world()
    if size == 1:
        pytest.skip("one rank cannot disagree with itself")
    with pytest.raises(RuntimeError, match="ranks called different collectives"):
        CALLS[case][0 if rank == 0 else 1]()
    goes_on()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["allreduce", "allgather", "broadcast"])
def test_a_handle_never_synchronized_is_completed_before_exit(kind):
    """A script that drops a named async handle (Horovod's duplicate-name tests do) exits with its
    requests still posted: drain, run at exit and at shutdown, completes them first, so MPI never
    writes into buffers Python has freed (before it, such runs crashed at exit in some runs)."""
    from mpi4py import MPI

    from hpctrain.horovod import handles

    rank, size = world()
    submit = {"allreduce": lambda t: hvd.allreduce_async(t, name="dropped"),
              "allgather": lambda t: hvd.allgather_async(t, name="dropped"),
              "broadcast": lambda t: hvd.broadcast_async(t, root_rank=0, name="dropped")}[kind]
    handle = submit(torch.full((17, 17), float(rank)))       # a temporary: only the handle holds it
    op = handles._handles[handle][0]
    handles.drain()
    assert handle not in handles._handles
    assert all(r == MPI.REQUEST_NULL for r in op.reqs), "drain left a request active"
    assert hvd.synchronize(submit(torch.ones(2))) is not None  # the name is free again
    goes_on()
