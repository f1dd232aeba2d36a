"""A changed byte in a shard stops every rank with the same line, whichever rank hashed the shard.

``mpiexec -n 2 .venv/bin/python -m pytest --only-mpi --color=no tests/mpi/test_data_integrity.py``

Opening a set with a communicator is collective: shard k is hashed by rank ``k % P`` and the
verdicts are allgathered (``shard_checks.py``), so with 2 ranks shard 2 is hashed by rank 0 alone and
rank 1 must still raise. Constructors that raise open nothing; every set that opened is closed
in the test (collective with ``mpio``) on every rank.
"""
import os
import shutil
import tempfile

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.data_tools.sources import SOURCES
from hpctrain.data_tools.writer import convert
from hpctrain.data import ShardError, ShardSet, read_index
from hpctrain.data.hdf5 import mpio_status
from hpctrain.topology import Topology

SHARD = "train-00002-of-00004.h5"
DRIVERS = ["serial"] + (["mpio"] if mpio_status(MPI.COMM_WORLD)[0] else [])


@pytest.fixture(scope="module")
def base():
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="hpctrain-integrity-") if comm.Get_rank() == 0 else None, root=0)
    if comm.Get_rank() == 0:
        convert(SOURCES["digits"](None), os.path.join(path, "clean"), 4, resume=False)
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def corrupted(base: str, where: str) -> str:
    """A copy of the clean dataset with one byte of ``SHARD`` flipped (rank 0 writes; all wait)."""
    comm = MPI.COMM_WORLD
    d = os.path.join(base, where.replace(" ", "-"))
    comm.Barrier()                          # no rank still reads the previous test's copy
    if comm.Get_rank() == 0:
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(os.path.join(base, "clean"), d)
        path = os.path.join(d, SHARD)
        with h5py.File(path, "r") as fh:
            x_off, y_off = fh["x"].id.get_offset(), fh["y"].id.get_offset()
        pos = {"x sample": x_off + 64 * 9 + 5, "y label": y_off + 8 * 3, "object header": 800}[where]
        with open(path, "r+b") as fh:
            fh.seek(pos)
            b = fh.read(1)[0]
            fh.seek(pos)
            fh.write(bytes([b ^ 0x01]))
    comm.Barrier()
    return d


@pytest.mark.mpi
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("where", ["x sample", "y label", "object header"])
@pytest.mark.parametrize("mode", ["shared", "node"])
def test_every_rank_raises_the_same_line(base, driver, where, mode):
    comm = MPI.COMM_WORLD
    d = corrupted(base, where)
    with pytest.raises(ShardError) as err:
        ShardSet(read_index(d), "train", comm=comm, driver=driver, verify=mode).close()
    msg = str(err.value)
    assert msg.startswith(os.path.join(d, SHARD) + ": checksum mismatch") and "\n" not in msg
    assert len(set(comm.allgather(msg))) == 1
    test = ShardSet(read_index(d), "test", comm=comm, driver=driver, verify=mode)   # other split: intact
    test.close()


@pytest.mark.mpi
@pytest.mark.parametrize("driver", DRIVERS)
def test_intact_data_reads_identically(base, driver):
    comm = MPI.COMM_WORLD
    idx = read_index(os.path.join(base, "clean"))
    checked = ShardSet(idx, "train", comm=comm, driver=driver)
    plain = ShardSet(idx, "train", verify="off", driver="serial")
    try:
        assert checked.driver == driver and checked.checks.verified == set(range(4))
        n = comm.Get_size()                      # index v3: metadata blocks at open, the rest as read
        said = f"metadata blocks checked at open over {n} rank(s), data blocks as first read"
        assert checked.checks.verify_ranks == n and said in checked.describe()
        lo, hi = 7 * comm.Get_rank(), checked.num_samples - 3
        for got, want in zip(checked.read_range(lo, hi), plain.read_range(lo, hi)):
            np.testing.assert_array_equal(got, want)
    finally:
        plain.close()
        checked.close()


@pytest.mark.mpi
def test_node_readers_verdict_is_shared_with_the_node():
    """reader=node: local rank 0 checks; the others trust it and never hash (2 ranks per node)."""
    from hpctrain.data import train_loader
    comm = MPI.COMM_WORLD
    topo = Topology.create(comm, 2)
    d = comm.bcast(tempfile.mkdtemp(prefix="hpctrain-integrity-node-") if comm.Get_rank() == 0 else None, root=0)
    try:
        if comm.Get_rank() == 0:
            convert(SOURCES["digits"](None), d, 2, resume=False)
        comm.Barrier()
        ld = train_loader(read_index(d), topo, batch_size=4, reader="node", hdf5_driver="serial")
        try:
            assert ld.shards.checks.verified == set(range(2))
            assert (ld.shards.checks.verify_s > 0) == (topo.local_rank == 0)
            x, _ = ld.shards.read_range(0, 2)                   # as the job's model check does
            assert x.shape == (2, 1, 8, 8) and (ld.shards.checks.verify_s > 0) == (topo.local_rank == 0)
        finally:
            ld.close()
    finally:
        topo.close()
        comm.Barrier()
        if comm.Get_rank() == 0:
            shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def small_blocks():
    """The digits with 1 KiB blocks (index v3): data blocks are checked as read, not at open."""
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="hpctrain-blocks-") if comm.Get_rank() == 0 else None, root=0)
    if comm.Get_rank() == 0:
        convert(SOURCES["digits"](None), os.path.join(path, "clean"), 4, resume=False, block_bytes=1024)
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.mpi
@pytest.mark.parametrize("driver", DRIVERS)
def test_bad_data_block_stops_the_rank_that_reads_it(small_blocks, driver):
    """The collective open passes (metadata intact); only the rank whose read touches the block
    raises, naming file and block (serial: read by pread; mpio: hashed as HDF5 read it)."""
    comm = MPI.COMM_WORLD
    d = corrupted(small_blocks, "x sample")
    path = os.path.join(d, SHARD)
    s = ShardSet(read_index(d), "train", comm=comm, driver=driver)
    try:
        start = int(s.starts[2])
        if comm.Get_rank() == 0:
            with pytest.raises(ShardError) as err:
                s.read_range(start, start + 20)                     # holds sample 9 of shard 2
            k = (corrupted_offset(path)) // 1024
            assert str(err.value) == (f"{path}: checksum mismatch in block {k} (bytes {k * 1024}..{(k + 1) * 1024}; "
                                      f"file changed or corrupted)")
        else:
            s.read_range(0, start)                                  # shards 0 and 1: intact
    finally:
        s.close()


def corrupted_offset(path: str) -> int:
    with h5py.File(path, "r") as fh:
        return fh["x"].id.get_offset() + 64 * 9 + 5


@pytest.mark.mpi
def test_bad_metadata_block_is_agreed_at_open(small_blocks):
    comm = MPI.COMM_WORLD
    d = corrupted(small_blocks, "object header")
    with pytest.raises(ShardError) as err:
        ShardSet(read_index(d), "train", comm=comm, driver="serial").close()
    assert str(err.value).startswith(os.path.join(d, SHARD) + ": checksum mismatch in block 0 (bytes 0..1024;")
    assert len(set(comm.allgather(str(err.value)))) == 1


@pytest.mark.mpi
def test_clean_small_blocks_read_identically(small_blocks):
    comm = MPI.COMM_WORLD
    idx = read_index(os.path.join(small_blocks, "clean"))
    checked = ShardSet(idx, "train", comm=comm, driver="serial")
    plain = ShardSet(idx, "train", verify="off", driver="serial")
    try:
        assert f"over {comm.Get_size()} rank(s), data blocks as first read" in checked.describe()
        lo, hi = 7 * comm.Get_rank(), checked.num_samples - 3
        for got, want in zip(checked.read_range(lo, hi), plain.read_range(lo, hi)):
            np.testing.assert_array_equal(got, want)
        assert all(c.done[c.data].sum() > 0 for c in checked.checks.blocks.values())
    finally:
        plain.close()
        checked.close()
