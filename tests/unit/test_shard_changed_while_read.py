"""A shard changed under a running reader is never read as data: truncated (the ``mpio`` driver reads
zeros past its end without an error), or rewritten after its blocks were checked."""
import os
import shutil

import h5py
import numpy as np
import pytest
from mpi4py import MPI

from hpctrain.data import ShardError, ShardSet, read_index
from hpctrain.data.hdf5 import mpio_status
from tests.shard_files import convert_digits, flip

SHARD = "train-00001-of-00004.h5"
DRIVERS = ["serial", pytest.param("mpio", marks=pytest.mark.skipif(not mpio_status(MPI.COMM_SELF)[0],
                                                                 reason="h5py without MPI"))]


@pytest.fixture(scope="module")
def digits_src(tmp_path_factory):
    return convert_digits(tmp_path_factory.mktemp("changed") / "digits")


@pytest.fixture
def digits(digits_src, tmp_path):
    d = tmp_path / "digits"
    shutil.copytree(digits_src, d)
    return str(d)


def _open(digits, driver, verify="shared"):
    return ShardSet(read_index(digits), "train", comm=MPI.COMM_SELF, driver=driver, verify=verify)


@pytest.mark.parametrize("verify", ["shared", "off"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_shard_truncated_after_its_first_epoch_stops_the_next_read(digits, driver, verify):
    s = _open(digits, driver, verify)
    try:
        assert s.driver == driver
        lo, hi = int(s.starts[1]), int(s.starts[2])
        first, _ = s.read_range(lo, hi)                          # epoch 1: every block checked, all fine
        with h5py.File(os.path.join(digits, SHARD), "r") as fh:   # independently: what the file holds
            assert np.array_equal(first, fh["x"][:])
        path = os.path.join(digits, SHARD)
        os.truncate(path, 15000)                                  # the issue's `truncate -s 15000`
        with pytest.raises(ShardError) as err:
            s.read_range(lo, hi)
        msg = str(err.value)
        assert msg.startswith(f"{path}: ") and "\n" not in msg and ("15000 bytes" in msg or "truncated" in msg)
    finally:
        s.close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_block_checked_once_is_checked_again_after_the_file_changed(digits, driver):
    s = _open(digits, driver)
    try:
        lo, hi = int(s.starts[1]), int(s.starts[2])
        s.read_range(lo, hi)                                     # every block of shard 1 matched once
        path = os.path.join(digits, SHARD)
        with h5py.File(path, "r") as fh:
            pos = fh["x"].id.get_offset() + 64 * 5 + 7
        st = os.stat(path)
        flip(path, pos)                                          # same size, a sample byte changed
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))   # a coarse clock: move it surely
        with pytest.raises(ShardError, match=f"{SHARD}: checksum mismatch"):
            s.read_range(lo, hi)
    finally:
        s.close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_touched_but_unchanged_shard_still_reads(digits, driver):
    s = _open(digits, driver)
    try:
        want, wy = s.read_range(0, s.num_samples)
        path = os.path.join(digits, SHARD)
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        got, gy = s.read_range(0, s.num_samples)                   # checked again, and equal
        assert np.array_equal(want, got) and np.array_equal(wy, gy)
    finally:
        s.close()
