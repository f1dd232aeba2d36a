"""Every Horovod tensor collective x dtype x {sync, async, in-place, grad} x {the whole job, a
process set}, against results computed locally from the rank-seeded data every rank can
regenerate (Horovod's documented semantics; its gradient conventions as its own tests check
them: allreduce -> allreduce of the gradients; allgather -> own rows of their average; broadcast
-> their average on the root, zeros elsewhere; alltoall -> alltoall back; reducescatter ->
allgather, times the set's size for Sum). Values are small integers, exact in every dtype."""
import pytest
import torch

import hpctrain.horovod.torch as hvd
from tests.mpi.horovod_session import hvd_on, world  # noqa: F401  (hvd_on: autouse fixture)
from tests.mpi.horovod_sets import WHERE, members, sets  # noqa: F401  (sets: fixture)

pytestmark = pytest.mark.mpi

INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
REDUCE_OPS = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}


def data(rank, dtype, rows=3, cols=2):
    v = (torch.arange(rows * cols) + rank) % 3 + 1
    return v.reshape(rows, cols).to(dtype)


def reduce_ref(op, ts, dtype):
    stack = torch.stack([t.double() for t in ts])
    out = {"Sum": stack.sum(0), "Average": stack.sum(0) / len(ts), "Min": stack.min(0).values,
           "Max": stack.max(0).values, "Product": stack.prod(0)}[op]
    return (out if dtype.is_floating_point else torch.trunc(out)).to(dtype)


def close(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}.get(a.dtype, 0.0)
    assert torch.allclose(a.double(), b.double(), rtol=tol, atol=0), (a, b)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", INTS + FLOATS, ids=str)
def test_allreduce(sets, where, op, dtype):
    for mode in ["sync", "async", "inplace", "grouped", "grouped_async", "grouped_inplace"]:
        allreduce_in(sets, where, mode, op, dtype)


def allreduce_in(sets, where, mode, op, dtype):
    ps, ranks = members(sets, where)
    rank = world()[0]
    mine, other = data(rank, dtype), data(rank + 1, dtype, rows=2)
    refs = [reduce_ref(op, [data(r, dtype) for r in ranks], dtype),
            reduce_ref(op, [data(r + 1, dtype, rows=2) for r in ranks], dtype)]
    kw = {"op": REDUCE_OPS[op], "process_set": ps}
    if mode == "sync":
        outs = [hvd.allreduce(mine, **kw)]
    elif mode == "async":
        outs = [hvd.synchronize(hvd.allreduce_async(mine, **kw))]
    elif mode == "inplace":
        outs = [hvd.allreduce_(mine, **kw)]
        assert outs[0] is mine
    elif mode == "grouped":
        outs = hvd.grouped_allreduce([mine, other], **kw)
    elif mode == "grouped_async":
        outs = hvd.synchronize(hvd.grouped_allreduce_async([mine, other], **kw))
    else:
        outs = hvd.grouped_allreduce_([mine, other], **kw)
        assert outs[0] is mine and outs[1] is other
    for out, ref in zip(outs, refs):
        close(out, ref)


def rows_of(rank):
    return rank % 3 + 1                   # allgather: ranks give different numbers of rows


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("dtype", INTS + FLOATS, ids=str)
def test_allgather(sets, where, dtype):
    for mode in ["sync", "async", "grouped", "grouped_async"]:
        allgather_in(sets, where, mode, dtype)


def allgather_in(sets, where, mode, dtype):
    ps, ranks = members(sets, where)
    rank = world()[0]
    mine, second = data(rank, dtype, rows=rows_of(rank)), data(rank, dtype, rows=1, cols=3)
    refs = [torch.cat([data(r, dtype, rows=rows_of(r)) for r in ranks]),
            torch.cat([data(r, dtype, rows=1, cols=3) for r in ranks])]
    if mode == "sync":
        outs = [hvd.allgather(mine, process_set=ps)]
    elif mode == "async":
        outs = [hvd.synchronize(hvd.allgather_async(mine, process_set=ps))]
    elif mode == "grouped":
        outs = hvd.grouped_allgather([mine, second], process_set=ps)
    else:
        outs = hvd.synchronize(hvd.grouped_allgather_async([mine, second], process_set=ps))
    for out, ref in zip(outs, refs):
        close(out, ref)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("dtype", INTS + FLOATS, ids=str)
def test_broadcast_from_every_member(sets, where, dtype):
    ps, ranks = members(sets, where)
    rank = world()[0]
    for root, mode in [(root, mode) for root in ranks for mode in ["sync", "async", "inplace"]]:
        mine = data(rank, dtype)
        if mode == "sync":
            out = hvd.broadcast(mine, root_rank=root, process_set=ps)
            close(mine, data(rank, dtype))                        # input untouched
        elif mode == "async":
            out = hvd.synchronize(hvd.broadcast_async(mine, root_rank=root, process_set=ps))
        else:
            out = hvd.broadcast_(mine, root_rank=root, process_set=ps)
            assert out is mine
        close(out, data(root, dtype))


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bfloat16, torch.float32], ids=str)
def test_alltoall(sets, where, dtype):
    for mode in ["sync", "async", "splits"]:
        alltoall_in(sets, where, mode, dtype)


def alltoall_in(sets, where, mode, dtype):
    ps, ranks = members(sets, where)
    rank, n = world()[0], len(ranks)
    me = ranks.index(rank)
    if mode == "splits":                  # member i sends i + j + 1 rows... to member j
        splits = [me + j + 1 for j in range(n)]
        mine = data(rank, dtype, rows=sum(splits))
        out, received = hvd.alltoall(mine, splits=splits, process_set=ps)
        assert received.tolist() == [i + me + 1 for i in range(n)]
        parts = []
        for i, r in enumerate(ranks):
            theirs = data(r, dtype, rows=sum(i + j + 1 for j in range(n)))
            start = sum(i + j + 1 for j in range(me))
            parts.append(theirs[start:start + i + me + 1])
        close(out, torch.cat(parts))
        return
    mine = data(rank, dtype, rows=2 * n)
    out = (hvd.alltoall(mine, process_set=ps) if mode == "sync"
           else hvd.synchronize(hvd.alltoall_async(mine, process_set=ps))[0])
    close(out, torch.cat([data(r, dtype, rows=2 * n)[2 * me:2 * me + 2] for r in ranks]))


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("op", ["Average", "Sum"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                                   torch.float64], ids=str)
def test_reducescatter(sets, where, op, dtype):
    for mode in ["sync", "async", "grouped", "grouped_async"]:
        reducescatter_in(sets, where, mode, op, dtype)


def reducescatter_in(sets, where, mode, op, dtype):
    ps, ranks = members(sets, where)
    rank, n = world()[0], len(ranks)
    me = ranks.index(rank)
    shapes = [(2 * n + 1, 2), (n, 3)]     # uneven: the first members get one row more
    mine = [data(rank, dtype, *s) for s in shapes]
    kw = {"op": REDUCE_OPS[op], "process_set": ps}
    if mode == "sync":
        outs = [hvd.reducescatter(mine[0], **kw)]
    elif mode == "async":
        outs = [hvd.synchronize(hvd.reducescatter_async(mine[0], **kw))]
    elif mode == "grouped":
        outs = hvd.grouped_reducescatter(mine, **kw)
    else:
        outs = hvd.synchronize(hvd.grouped_reducescatter_async(mine, **kw))
    for out, shape in zip(outs, shapes):
        full = reduce_ref(op, [data(r, dtype, *shape) for r in ranks], dtype)
        base, extra = divmod(shape[0], n)
        start = me * base + min(me, extra)
        close(out, full[start:start + base + (me < extra)])


# --- gradients ---------------------------------------------------------------------------------
def leaf(rank, dtype, rows=3, cols=2):
    return data(rank, dtype, rows, cols).requires_grad_()


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("op", ["Average", "Sum"])
@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_allreduce_and_reducescatter_gradients(sets, where, op, grouped, dtype):
    ps, ranks = members(sets, where)
    rank, n = world()[0], len(ranks)
    factor = n if op == "Sum" else 1
    xs = [leaf(rank, dtype, rows=2 * n), leaf(rank, dtype, rows=n, cols=3)]
    kw = {"op": REDUCE_OPS[op], "process_set": ps}
    outs = hvd.grouped_allreduce(xs, **kw) if grouped else [hvd.allreduce(xs[0], **kw)]
    sum(o.sum() for o in outs).backward()
    for x in xs[:len(outs)]:
        close(x.grad, torch.full_like(x, factor))
        x.grad = None
    outs = hvd.grouped_reducescatter(xs, **kw) if grouped else [hvd.reducescatter(xs[0], **kw)]
    sum(o.sum() for o in outs).backward()
    for x in xs[:len(outs)]:
        close(x.grad, torch.full_like(x, factor))


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
def test_allgather_gradient_is_own_rows_of_the_average(sets, where, grouped):
    ps, ranks = members(sets, where)
    rank = world()[0]
    xs = [leaf(rank, torch.float64, rows=rows_of(rank)), leaf(rank, torch.float64, rows=1)]
    outs = hvd.grouped_allgather(xs, process_set=ps) if grouped else [hvd.allgather(xs[0], process_set=ps)]
    # member r weighs the gathered rows by (r + 1) * (row index + 1)
    sum(((o * (rank + 1)) * torch.arange(1, o.shape[0] + 1, dtype=o.dtype)[:, None]).sum()
        for o in outs).backward()
    mean_w = sum(r + 1 for r in ranks) / len(ranks)
    for x, rows in zip(xs, [[rows_of(r) for r in ranks], [1] * len(ranks)]):
        start = sum(rows[:ranks.index(rank)])
        idx = torch.arange(start + 1, start + x.shape[0] + 1, dtype=x.dtype)[:, None]
        close(x.grad, (mean_w * idx).expand_as(x).contiguous())
        if not grouped:
            break


@pytest.mark.parametrize("where", WHERE)
def test_broadcast_and_alltoall_gradients(sets, where):
    ps, ranks = members(sets, where)
    rank, n = world()[0], len(ranks)
    root = ranks[-1]
    x = leaf(rank, torch.float64)
    (hvd.broadcast(x, root_rank=root, process_set=ps) * (rank + 1)).sum().backward()
    mean_w = sum(r + 1 for r in ranks) / n
    close(x.grad, torch.full_like(x, mean_w if rank == root else 0.0))
    y = leaf(rank, torch.float64, rows=2 * n)
    (hvd.alltoall(y, process_set=ps) * (rank + 1)).sum().backward()   # my rows j went to member j
    close(y.grad, torch.tensor([r + 1.0 for r in ranks for _ in range(2)], dtype=torch.float64)[:, None]
          .expand_as(y).contiguous())
