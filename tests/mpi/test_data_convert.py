"""Parallel conversion: P ranks write the same shard directory as one rank does.

``mpiexec -n 2 .venv/bin/python -m pytest --only-mpi --color=no tests/mpi/test_data_convert.py``
"""
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI
from PIL import Image

from hpctrain.data_tools.cli import main as tools_main
from hpctrain.data_tools.readers import SOURCES
from hpctrain.data_tools.writer import ConvertError, convert
from hpctrain.data import ShardSet, read_index


@pytest.fixture
def shared_tmpdir():
    """One directory for all ranks (rank 0 makes it and removes it afterwards)."""
    comm = MPI.COMM_WORLD
    path = comm.bcast(tempfile.mkdtemp(prefix="hpctrain-convert-") if comm.Get_rank() == 0 else None, root=0)
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def make_tree(root, rng):
    for cls in ("ant", "bee", "cow"):
        os.makedirs(os.path.join(root, cls))
        for k in range(7):
            a = rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)
            Image.fromarray(a).save(os.path.join(root, cls, f"{k}.png"))


@pytest.mark.mpi
def test_parallel_conversion_equals_serial(shared_tmpdir, closer):
    comm = MPI.COMM_WORLD
    base = shared_tmpdir
    if comm.Get_rank() == 0:
        make_tree(os.path.join(base, "src"), np.random.default_rng(0))
    comm.Barrier()
    args = ["convert", "--from", "imagefolder", os.path.join(base, "src"), "--shards", "5", "--no-progress"]
    assert tools_main(args + ["--out", os.path.join(base, "par")]) == 0            # all ranks, COMM_WORLD
    if comm.Get_rank() == 0:                                                       # one rank, COMM_SELF
        src = SOURCES["imagefolder"](os.path.join(base, "src"))
        convert(src, os.path.join(base, "ser"), 5, comm=MPI.COMM_SELF)
    comm.Barrier()
    par = json.load(open(os.path.join(base, "par", "index.json")))
    ser = json.load(open(os.path.join(base, "ser", "index.json")))
    assert par == ser                                   # counts, shapes, classes, statistics, SHA-256s
    for split in ("train", "test"):
        a = closer(ShardSet(read_index(os.path.join(base, "par")), split))
        b = closer(ShardSet(read_index(os.path.join(base, "ser")), split))
        for got, want in zip(a.read_range(0, a.num_samples), b.read_range(0, b.num_samples)):
            np.testing.assert_array_equal(got, want)
        a.close()
        b.close()
    # resume rewrites ser/index.json: no rank may still be reading it (the race that hung CI)
    comm.Barrier()
    # resume: every rank verifies and keeps its finished shards
    meta = convert(SOURCES["imagefolder"](os.path.join(base, "src")), os.path.join(base, "ser"), 5, comm=comm)
    n_shards = sum(len(sp["shards"]) for sp in ser["splits"].values())   # test split: 4 samples, 4 shards
    assert meta["skipped_shards"] == n_shards and json.load(open(os.path.join(base, "ser", "index.json"))) == ser


@pytest.mark.mpi
def test_failure_on_one_rank_fails_all_without_index(shared_tmpdir):
    comm = MPI.COMM_WORLD
    base = shared_tmpdir
    if comm.Get_rank() == 0:
        make_tree(os.path.join(base, "src"), np.random.default_rng(1))
        with open(os.path.join(base, "src", "bee", "3.png"), "wb") as fh:
            fh.write(b"\x89PNG\r\n\x1a\n broken")
    comm.Barrier()
    src = SOURCES["imagefolder"](os.path.join(base, "src"), size=(4, 4))
    with pytest.raises(ConvertError, match=r"bee/3.png: unreadable image"):
        convert(src, os.path.join(base, "out"), 4, comm=comm)
    assert not os.path.exists(os.path.join(base, "out", "index.json"))
