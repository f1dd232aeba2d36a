"""hpctrain.horovod's tensor collectives against independent computations: mpi4py's own
collectives on NumPy copies of the same data, or the global result computed locally from the
rank-seeded data every rank can regenerate. Values are small integers (exact in every dtype and
in any reduction order), so results are compared bit for bit."""
import os

import numpy as np
import pytest
import torch
from mpi4py import MPI

import hpctrain.horovod.torch as hvd
from tests.mpi.horovod_session import hvd_on, world  # noqa: F401  (hvd_on: autouse fixture)

pytestmark = pytest.mark.mpi

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPES = INTS + FLOATS
OPS = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
MPI_OPS = {"Average": MPI.SUM, "Sum": MPI.SUM, "Min": MPI.MIN, "Max": MPI.MAX, "Product": MPI.PROD}


def data(rank, dtype, shape=(2, 5)):
    """Rank ``rank``'s tensor: values in 1..3 (-3..3 for signed types), so a product over 4 ranks
    fits int8 and every sum is exact in fp16/bf16."""
    n = int(np.prod(shape))
    v = (torch.arange(n) + rank) % 3 + 1
    if dtype not in (torch.uint8,):
        v = v * torch.where(torch.arange(n) % 2 == 0, 1, -1)
    return v.reshape(shape).to(dtype)


def as_numpy(t):
    """A NumPy array MPI can reduce (fp16/bf16 as fp32: MPI has no half-precision sum)."""
    return t.float().numpy() if t.dtype in (torch.float16, torch.bfloat16) else t.numpy().copy()


# --- allreduce ----------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_every_op_and_dtype_equals_mpi(dtype, op):
    rank, size = world()
    mine = data(rank, dtype)
    ref = as_numpy(mine)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, ref, op=MPI_OPS[op])
    if op == "Average":
        ref = np.trunc(ref / size) if not dtype.is_floating_point else ref / size
    expected = torch.from_numpy(np.asarray(ref)).to(dtype)
    out = hvd.allreduce(mine, op=OPS[op], name=f"ar.{op}.{dtype}")
    assert out.dtype == dtype and torch.equal(out, expected), (out, expected)
    assert torch.equal(mine, data(rank, dtype))                  # out of place: input untouched


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.int32], ids=str)
@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_prescale_and_postscale(dtype, op):
    rank, size = world()
    mine = data(rank, dtype)
    pre = as_numpy(mine).astype(np.float64) * 0.5
    pre = pre if dtype.is_floating_point else np.trunc(pre)     # integers truncate, as Horovod
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, pre, op=MPI.SUM)
    post = pre * 3.0 / (size if op == "Average" else 1)
    expected = torch.from_numpy(post if dtype.is_floating_point else np.trunc(post)).to(dtype)
    out = hvd.allreduce(mine, op=OPS[op], prescale_factor=0.5, postscale_factor=3.0)
    assert torch.equal(out, expected), (out, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_sums_accumulate_in_fp32(dtype):
    """Rank 0 holds 1, the others half a unit in the last place each: added in fp16 one rank at a
    time every half is lost (ties to even); in fp32 they add up before the one rounding."""
    rank, size = world()
    half_ulp = torch.finfo(dtype).eps / 2
    mine = torch.full((3,), 1.0 if rank == 0 else half_ulp, dtype=dtype)
    out = hvd.allreduce(mine, op=hvd.Sum)
    expected = torch.tensor(1.0 + (size - 1) * half_ulp, dtype=torch.float64).to(dtype)
    assert torch.all(out == expected), (out, expected)
    if size >= 3:
        assert torch.all(out > 1.0)                                 # fp16 accumulation gives 1.0


def test_allreduce_compression_fp16_and_average_flag():
    rank, size = world()
    out = hvd.allreduce(torch.full((4,), float(rank)), compression=hvd.Compression.fp16)
    assert out.dtype == torch.float32 and torch.all(out == (size - 1) / 2)
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(torch.full((2,), float(rank)), average=False)
    assert torch.all(out == size * (size - 1) / 2)


def test_grouped_allreduce_mixed_dtypes_equals_per_tensor_sums():
    rank, size = world()
    shapes = [((3,), torch.float32), ((2, 2), torch.int32), ((5,), torch.float16), ((1,), torch.float32),
              ((), torch.float64)]
    mine = [data(rank, dt, sh) for sh, dt in shapes]
    expected = [sum(data(r, dt, sh).double() for r in range(size)).to(dt) for sh, dt in shapes]
    outs = hvd.grouped_allreduce(mine, op=hvd.Sum)
    assert all(torch.equal(o, e) for o, e in zip(outs, expected))
    same = hvd.grouped_allreduce_(mine, op=hvd.Sum)                 # in place
    assert all(s is m and torch.equal(m, e) for s, m, e in zip(same, mine, expected))


def test_in_place_allreduce_writes_the_tensor_itself():
    rank, size = world()
    t = data(rank, torch.float32)
    ptr = t.data_ptr()
    out = hvd.allreduce_(t, op=hvd.Max)
    assert out is t and t.data_ptr() == ptr
    assert torch.equal(t, torch.stack([data(r, torch.float32) for r in range(size)]).amax(0))
    p = torch.nn.Parameter(torch.full((3,), float(rank)))           # a leaf that requires grad
    hvd.allreduce_(p, op=hvd.Sum)
    assert torch.all(p.detach() == size * (size - 1) / 2)


# --- allgather, broadcast, alltoall, reducescatter ----------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allgather_variable_first_dimension(dtype):
    rank, size = world()
    mine = data(rank, dtype, (rank * 2, 2, 3))                     # rank 0 has no rows
    expected = torch.cat([data(r, dtype, (r * 2, 2, 3)) for r in range(size)])
    out = hvd.allgather(mine)
    assert out.dtype == dtype and torch.equal(out, expected)
    counts = MPI.COMM_WORLD.allgather(mine.numel())                 # and mpi4py's Allgatherv
    ref = np.empty(sum(counts), dtype=np.float64)
    MPI.COMM_WORLD.Allgatherv(mine.double().numpy().ravel(), [ref, counts])
    assert np.array_equal(out.double().numpy().ravel(), ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast_from_the_last_rank(dtype):
    rank, size = world()
    root = size - 1
    mine = data(rank, dtype)
    out = hvd.broadcast(mine, root_rank=root, name=f"bc.{dtype}")
    assert torch.equal(out, data(root, dtype)) and torch.equal(mine, data(rank, dtype))
    ref = as_numpy(mine)
    MPI.COMM_WORLD.Bcast(ref, root=root)
    assert np.array_equal(as_numpy(out), ref)
    same = hvd.broadcast_(mine, root_rank=0)
    assert same is mine and torch.equal(mine, data(0, dtype))


def test_alltoall_equal_shares():
    rank, size = world()
    mine = torch.stack([torch.full((3,), rank * 100 + j, dtype=torch.int32) for j in range(2 * size)])
    out = hvd.alltoall(mine)
    expected = torch.stack([torch.full((3,), s * 100 + 2 * rank + k, dtype=torch.int32)
                            for s in range(size) for k in range(2)])
    assert torch.equal(out, expected)


def test_alltoall_with_splits_equals_mpi_alltoallv():
    rank, size = world()

    def splits(r):
        return [(r + d) % 3 for d in range(size)]
    rows = sum(splits(rank))
    mine = torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2) + 1000 * rank
    out, received = hvd.alltoall(mine, splits=torch.tensor(splits(rank), dtype=torch.int32))
    assert received.tolist() == [splits(s)[rank] for s in range(size)]
    expected = []
    for s in range(size):
        theirs = torch.arange(sum(splits(s)) * 2, dtype=torch.float64).reshape(-1, 2) + 1000 * s
        start = sum(splits(s)[:rank])
        expected.append(theirs[start:start + splits(s)[rank]])
    assert torch.equal(out, torch.cat(expected))
    sc = [2 * c for c in splits(rank)]
    rc = [2 * c for c in received.tolist()]
    ref = np.empty(sum(rc))
    MPI.COMM_WORLD.Alltoallv([mine.numpy().ravel(), sc], [ref, rc])
    assert np.array_equal(out.numpy().ravel(), ref)


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_uneven_rows_equals_mpi(op):
    rank, size = world()
    rows = 2 * size + 1                                            # the first rank gets one more
    mine = data(rank, torch.float64, (rows, 3))
    counts = [(rows // size + (1 if r < rows % size else 0)) * 3 for r in range(size)]
    ref = np.empty(counts[rank])
    MPI.COMM_WORLD.Reduce_scatter(mine.numpy().ravel(), ref, counts, op=MPI.SUM)
    if op == "Average":
        ref = ref / size
    out = hvd.reducescatter(mine, op=OPS[op])
    assert out.shape == (counts[rank] // 3, 3) and np.array_equal(out.numpy().ravel(), ref)
    total = sum(data(r, torch.float64, (rows, 3)) for r in range(size))
    start = sum(counts[:rank]) // 3
    assert torch.equal(out * (size if op == "Average" else 1), total[start:start + counts[rank] // 3])


# --- async, poll, synchronize ------------------------------------------------------------------
def test_async_handles_poll_and_synchronize_in_any_order():
    rank, size = world()
    x = data(rank, torch.float32)
    h1 = hvd.allreduce_async(x, op=hvd.Sum, name="async.sum")
    h2 = hvd.allgather_async(x[:1], name="async.gather")
    h3 = hvd.broadcast_async_(x.clone(), root_rank=size - 1, name="async.bcast")
    h4 = hvd.reducescatter_async(data(rank, torch.float32, (size, 2)), op=hvd.Sum)
    h5 = hvd.grouped_allreduce_async([x, x.double()], op=hvd.Min)
    h6 = hvd.alltoall_async(torch.full((size, 1), float(rank)))
    assert len({h1, h2, h3, h4, h5, h6}) == 6
    while not hvd.poll(h1):
        pass
    assert hvd.poll(h1)
    bc = hvd.synchronize(h3)
    out, received = hvd.synchronize(h6)
    assert torch.equal(out.ravel(), torch.arange(size, dtype=torch.float32)) and received.tolist() == [1] * size
    mins = hvd.synchronize(h5)
    assert torch.equal(mins[0], torch.stack([data(r, torch.float32) for r in range(size)]).amin(0))
    assert torch.equal(bc, data(size - 1, torch.float32))
    assert torch.equal(hvd.synchronize(h4), sum(data(r, torch.float32, (size, 2)) for r in range(size))[rank:rank + 1])
    assert torch.equal(hvd.synchronize(h2), torch.cat([data(r, torch.float32)[:1] for r in range(size)]))
    assert torch.equal(hvd.synchronize(h1), sum(data(r, torch.float32) for r in range(size)))
    assert hvd.synchronize(h1) is None                            # consumed, as Horovod
    with pytest.raises(ValueError, match="unknown handle"):
        hvd.poll(h1)
    h = hvd.allreduce_async_(x, op=hvd.Max)
    assert hvd.synchronize(h) is x


# --- autograd ----------------------------------------------------------------------------------
def weights(rank, shape):
    return torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape) + 10 * rank


@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_allreduce_gradient_is_that_of_the_sum_of_every_ranks_loss(op):
    """Rank r's loss is (w_r * allreduce(x)).sum(); d(sum_r loss_r)/dx_s = sum_r w_r (Sum) or its
    mean (Average), what Horovod's backward (an allreduce of the gradient) gives."""
    rank, size = world()
    x = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    (hvd.allreduce(x, op=OPS[op]) * weights(rank, (2, 3))).sum().backward()
    total = sum(weights(r, (2, 3)) for r in range(size))
    assert torch.equal(x.grad, total / size if op == "Average" else total)


def test_allgather_gradient_is_the_mean_over_ranks_of_own_rows():
    rank, size = world()
    x = torch.ones(rank + 1, 2, dtype=torch.float64, requires_grad=True)
    rows = size * (size + 1) // 2
    (hvd.allgather(x) * weights(rank, (rows, 2))).sum().backward()
    mean_w = sum(weights(r, (rows, 2)) for r in range(size)) / size
    start = rank * (rank + 1) // 2
    assert torch.equal(x.grad, mean_w[start:start + rank + 1])


def test_broadcast_gradient_goes_to_the_root_only():
    rank, size = world()
    root = size - 1
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    (hvd.broadcast(x, root_rank=root) * weights(rank, (4,))).sum().backward()
    mean_w = sum(weights(r, (4,)) for r in range(size)) / size
    assert torch.equal(x.grad, mean_w if rank == root else torch.zeros(4, dtype=torch.float64))


# --- join, objects, barrier, topology ---------------------------------------------------------
def test_join_with_uneven_batches_returns_the_last_rank_to_join():
    """Rank r has r + 1 batches; joined ranks add zeros (Average still divides by every rank).
    As in Horovod, allgather and broadcast raise on the active ranks while a rank has joined
    (the joined rank waits on), and the next collective works."""
    rank, size = world()
    for step in range(rank + 1):
        active = size - step
        total = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="join.sum")
        mean = hvd.allreduce(torch.ones(2, dtype=torch.float64), name="join.mean")
        grouped = hvd.grouped_allreduce([torch.ones(2), torch.ones(1, dtype=torch.int32)], op=hvd.Sum)
        assert torch.all(total == active) and torch.all(mean == active / size)
        assert grouped[0].tolist() == [active] * 2 and grouped[1].tolist() == [active]
        if step > 0:
            with pytest.raises(RuntimeError, match="joined"):
                hvd.allgather(torch.ones(1, 2))                       # unnamed
            with pytest.raises(RuntimeError, match="joined"):
                hvd.broadcast(torch.ones(2), root_rank=size - 1, name="join.bcast")
    assert hvd.join() == size - 1
    out = hvd.allgather(torch.ones(1))             # unnamed: joined ranks' names still agree
    assert out.tolist() == [1.0] * size
    assert hvd.join() == (size - 1 if size > 1 else 0)            # all at once: still one rank


def test_broadcast_object_and_allgather_object():
    rank, size = world()
    obj = {"rank": rank, "items": list(range(rank)), "name": f"r{rank}"}
    assert hvd.broadcast_object(obj, root_rank=size - 1) == {"rank": size - 1, "items": list(range(size - 1)),
                                                             "name": f"r{size - 1}"}
    assert hvd.allgather_object(obj) == [{"rank": r, "items": list(range(r)), "name": f"r{r}"}
                                         for r in range(size)]
    hvd.barrier()


def test_rank_queries_equal_mpis_own_split():
    """Nodes are MPI's shared-memory split (or the emulated ones of HPCTRAIN_RANKS_PER_NODE)."""
    world_comm = MPI.COMM_WORLD
    rpn = int(os.environ.get("HPCTRAIN_RANKS_PER_NODE", "0") or 0)
    node = (world_comm.Split(world_comm.Get_rank() // rpn, key=world_comm.Get_rank()) if rpn else
            world_comm.Split_type(MPI.COMM_TYPE_SHARED, key=world_comm.Get_rank()))
    cross = world_comm.Split(color=node.Get_rank(), key=world_comm.Get_rank())
    try:
        assert (hvd.rank(), hvd.size()) == (world_comm.Get_rank(), world_comm.Get_size())
        assert (hvd.local_rank(), hvd.local_size()) == (node.Get_rank(), node.Get_size())
        assert (hvd.cross_rank(), hvd.cross_size()) == (cross.Get_rank(), cross.Get_size())
        local_sizes = world_comm.allgather(node.Get_size())
        assert hvd.is_homogeneous() == (len(set(local_sizes)) == 1)
        assert hvd.is_initialized() and hvd.mpi_enabled() and hvd.mpi_built() and not hvd.gloo_enabled()
        assert hvd.mpi_threads_supported() == (MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    finally:
        cross.Free()
        node.Free()


def test_timeline_is_written_by_rank_0_between_start_and_stop(tmp_path):
    """Every rank calls start/stop (as Horovod's tests do); rank 0 alone writes the trace, with
    each collective's agreement and data spans under Horovod's operation names."""
    import json
    rank, size = world()
    path = MPI.COMM_WORLD.bcast(str(tmp_path / "timeline.json"), root=0)
    hvd.start_timeline(path, mark_cycles=True)
    hvd.allreduce(torch.ones(3), name="test_allreduce")
    hvd.synchronize(hvd.allgather_async(torch.ones(1, 2)))
    hvd.stop_timeline()
    hvd.barrier()
    if rank == 0:
        names = [e["name"] for e in json.loads(open(path).read())["traceEvents"]]
        for name in ("NEGOTIATE_ALLREDUCE allreduce.test_allreduce", "ALLREDUCE allreduce.test_allreduce",
                     "CYCLE_START"):
            assert name in names, names
        assert any(n.startswith("ALLGATHER allgather.noname.") for n in names), names
    hvd.barrier()
