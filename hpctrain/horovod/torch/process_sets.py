"""Process sets: only the global one. Horovod scripts pass ``process_set=hvd.global_process_set``
(or nothing); any other set is refused with one line (run one job per group of ranks)."""
from __future__ import annotations

from typing import NoReturn

from hpctrain.horovod.torch.errors import unsupported


class ProcessSet:
    """Horovod's process-set handle. Only :data:`global_process_set` exists here."""

    process_set_id = 0

    def __init__(self, ranks_or_comm=None):
        if ranks_or_comm is not None:
            raise unsupported("ProcessSet(ranks)", "run one job per group of ranks, or pass an mpi4py "
                              "communicator to hvd.init(comm=...)")

    def rank(self) -> int:
        from hpctrain.horovod.torch.basics import rank
        return rank()

    def size(self) -> int:
        from hpctrain.horovod.torch.basics import size
        return size()

    def included(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=0, global)"


global_process_set = ProcessSet()


def check_process_set(process_set) -> None:
    if process_set is not None and process_set is not global_process_set:
        raise unsupported("a process set other than hvd.global_process_set",
                          "run one job per group of ranks")


def add_process_set(process_set) -> NoReturn:
    raise unsupported("add_process_set", "run one job per group of ranks, or pass an mpi4py "
                      "communicator to hvd.init(comm=...)")


def remove_process_set(process_set) -> NoReturn:
    raise unsupported("remove_process_set", "process sets are not supported")
