"""Node-level reading and parallel HDF5 give each rank exactly the batches of per-rank serial reading.

``mpiexec -n 2 .venv/bin/python -m pytest --only-mpi --color=no tests/mpi/test_data_node.py``
"""
import shutil
import tempfile

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain.data_tools.sources import from_arrays
from hpctrain.data_tools.writer import convert
from hpctrain.data import ShardLoader, ShardSet, read_index
from hpctrain.data.augment import Augment
from hpctrain.topology import Topology


@pytest.fixture(scope="module")
def dataset():
    comm = MPI.COMM_WORLD
    path = tempfile.mkdtemp(prefix="hpctrain-node-") if comm.Get_rank() == 0 else None
    path = comm.bcast(path, root=0)
    if comm.Get_rank() == 0:
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, (157, 3, 6, 5), dtype=np.uint8)
        convert(from_arrays({"train": (x, rng.integers(0, 4, 157))}, list("abcd"), "t"), path, 3)
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def batches(loader, epoch, n=None, **kw):
    it = loader.epoch(epoch, **kw)
    return [next(it) for _ in range(n)] if n else list(it)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks_per_node", [0, 1, 2])
def test_node_reader_equals_per_rank(dataset, ranks_per_node, closer):
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node))
    idx = read_index(dataset)
    serial = closer(ShardSet(idx, "train", driver="serial"))
    # the node's reader opens the files (collectively over the readers with mpio); others never read
    shared = closer(ShardSet(idx, "train", comm=topo.inter) if topo.local_rank == 0
                    else ShardSet(idx, "train", driver="serial"))
    kw = dict(rank=topo.rank, size=topo.size, batch_size=6, block_size=5, shuffle_window=24,
              transform=Augment("padcrop"))
    per_rank = closer(ShardLoader(serial, **kw))
    node = closer(ShardLoader(shared, node_comm=topo.intra, node_slots=2, **kw))
    assert "node-level reading" in node.describe()
    for epoch, n in ((0, None), (1, 3), (2, None)):            # epoch 1 is abandoned after 3 batches
        want, got = batches(per_rank, epoch, n), batches(node, epoch, n)
        assert len(got) == len(want) == (n or per_rank.steps)
        for (x1, y1), (x2, y2) in zip(want, got):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)
    ys = comm.allgather(torch.cat([y for _, y in batches(node, 3, augment=False)]).tolist())
    assert len(sum(ys, [])) == per_rank.steps * per_rank.global_batch


@pytest.mark.mpi
def test_mpio_reads_equal_serial(dataset, closer):
    comm = MPI.COMM_WORLD
    idx = read_index(dataset)
    par = closer(ShardSet(idx, "train", comm=comm, driver="auto"))
    ser = closer(ShardSet(idx, "train", driver="serial"))
    assert par.driver == "mpio" and "driver='mpio'" in par.describe()
    lo, hi = comm.Get_rank() * 11, 157 - comm.Get_rank() * 7          # different ranges per rank
    for got, want in zip(par.read_range(lo, hi), ser.read_range(lo, hi)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.mpi
@pytest.mark.parametrize("reader,driver", [("rank", "auto"), ("rank", "serial"), ("node", "auto")])
def test_factory_loaders_agree(dataset, reader, driver, closer):
    from hpctrain.data import open_split, train_loader
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, 2))
    idx = read_index(dataset)
    kw = dict(batch_size=5, seed=4, block_size=6, shuffle_window=30, augment=True, augment_kind="padcrop")
    ref = closer(train_loader(idx, topo, reader="rank", hdf5_driver="serial", **kw))
    ld = closer(train_loader(idx, topo, reader=reader, hdf5_driver=driver, **kw))
    assert ("node-level" in ld.describe()) == (reader == "node")
    assert ("mpio" in ld.describe()) == (driver == "auto" and (reader == "rank" or topo.local_rank == 0))
    for epoch in (0, 1):
        for (x1, y1), (x2, y2) in zip(ref.epoch(epoch), ld.epoch(epoch)):
            assert torch.equal(x1, x2) and torch.equal(y1, y2)
    test = closer(open_split(idx, "train", topo, driver=driver))
    assert test.read_range(0, 3)[0].shape == (3, 3, 6, 5)
    with pytest.raises(ValueError, match="config data.reader: expected one of rank | node, got 'disk'"):
        closer(train_loader(idx, topo, batch_size=4, reader="disk"))


@pytest.mark.mpi
def test_node_reader_cuts_each_ranks_jpeg_crops(closer, tmp_path_factory):
    """Whole-image JPEG shards: the node's reader decodes every local rank's batches with that
    rank's crops (its world rank, its sample positions), the same as the rank decoding them itself."""
    from hpctrain.tools.bench.input_data import photos
    from tests.unit.test_data_jpeg_loader import write_jpeg_shards
    comm = MPI.COMM_WORLD
    path = comm.bcast(str(tmp_path_factory.mktemp("nodejpeg")) if comm.Get_rank() == 0 else None, root=0)
    if comm.Get_rank() == 0:
        write_jpeg_shards(path, photos(36, seed=2, size=(48, 56)))
    comm.Barrier()
    topo = closer(Topology.create(comm, 2))
    idx = read_index(path)
    kw = dict(rank=topo.rank, size=topo.size, batch_size=4, block_size=4, shuffle_window=8,
              transform=Augment("rrc"), workers=2)
    per_rank = closer(ShardLoader(closer(ShardSet(idx, "train", driver="serial")), **kw))
    shared = closer(ShardSet(idx, "train", driver="serial"))
    node = closer(ShardLoader(shared, node_comm=topo.intra, **kw))
    for epoch, augment in ((0, True), (1, True), (1, False)):
        want, got = batches(per_rank, epoch, augment=augment), batches(node, epoch, augment=augment)
        assert len(got) == len(want) == per_rank.steps
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(want, got))
