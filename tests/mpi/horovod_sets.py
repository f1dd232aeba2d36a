"""The process sets the Horovod-API MPI tests run on: the whole job, and this rank's half (even
or odd ranks). Import ``sets`` into a test module beside ``hvd_on``; ``members(where)`` gives
the job ranks of the set a test runs on and the set itself."""
import pytest

import hpctrain.horovod.torch as hvd
from tests.mpi.horovod_session import world

WHERE = ["global", "half"]


@pytest.fixture(scope="module")
def sets(hvd_on):
    rank, size = world()
    if size == 1:                          # the one half would be the job itself
        yield {"global": hvd.global_process_set, "half": hvd.global_process_set, "other": None}
        return
    halves = [hvd.add_process_set([r for r in range(size) if r % 2 == k]) for k in (0, 1)]
    yield {"global": hvd.global_process_set, "half": halves[rank % 2], "other": halves[1 - rank % 2]}
    for ps in halves:
        assert hvd.remove_process_set(ps)


def members(sets, where):
    ps = sets[where]
    return ps, list(ps.ranks)
