"""What the Horovod-API MPI tests share: ``hpctrain.horovod`` initialised for a test module (import
``hvd_on`` into it: the autouse fixture then applies there) and this rank's place in the world."""
import pytest
from mpi4py import MPI

import hpctrain.horovod.torch as hvd


@pytest.fixture(scope="module", autouse=True)
def hvd_on():
    hvd.init()
    yield
    hvd.shutdown()


def world():
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
