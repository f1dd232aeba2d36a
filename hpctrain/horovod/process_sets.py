"""The job's Horovod state (:func:`state`) and its process sets on MPI sub-communicators.

:func:`state` holds what ``hvd.init`` made (hpctrain's communicator, the topology, the registered
sets and optimizers); every operation reaches it through here, so "not initialized" is one line
wherever it is met.

A :class:`ProcessSet` is a group of ranks (Horovod's ranks of the job, sorted) or, with MPI, an
mpi4py communicator each member passes. :func:`add_process_set` is collective over the whole
job, as in Horovod: the ranks are agreed by the global coordinator, one ``Split`` of hpctrain's
communicator gives the members their own communicator, and the set gets its own coordinator,
so collectives with ``process_set=`` are agreed (and their mismatches raised) among its members
only. ``hvd.global_process_set`` is the whole job. Ranks passed as ``root_rank`` are ranks of the
job, as in Horovod; results are in the set's rank order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from mpi4py import MPI

from hpctrain.horovod import timeline as T
from hpctrain.horovod.coordinator import Coordinator, Sig, Verdict
from hpctrain.topology import Topology, emulated_ranks_per_node


@dataclass
class State:
    """What ``hvd.init`` made, until ``hvd.shutdown`` frees it."""
    comm: MPI.Comm                  # hpctrain.horovod's own duplicate of the user's communicator
    topo: Topology
    coord: Coordinator
    optimizers: dict = field(default_factory=dict)   # id -> DistributedOptimizer (join mirrors)
    process_sets: dict = field(default_factory=dict)  # id -> registered ProcessSet
    next_set_id: int = 1


_state: State | None = None


def state() -> State:
    if _state is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _state


def is_initialized() -> bool:
    return _state is not None


def set_state(new: State | None) -> None:
    """``hvd.init`` installs the job's state, ``hvd.shutdown`` clears it."""
    global _state
    _state = new


class ProcessSet:
    """``hvd.ProcessSet(ranks)`` or ``hvd.ProcessSet(mpi4py_comm)``; registered by
    :func:`add_process_set` or ``hvd.init(process_sets=[...])``."""

    def __init__(self, ranks_or_comm=None):
        self.process_set_id: int | None = None
        self.mpi_comm = ranks_or_comm if isinstance(ranks_or_comm, MPI.Comm) else None
        self.ranks: list[int] | None = None
        if ranks_or_comm is not None and self.mpi_comm is None:
            self.ranks = sorted(int(r) for r in ranks_or_comm)
        self.comm: MPI.Comm = MPI.COMM_NULL   # the members' communicator (hpctrain's own)
        self.coord: Coordinator | None = None
        self.counters: dict[str, int] = {}    # automatic names: kind -> next index
        self._topo = None

    # --- Horovod's queries -------------------------------------------------------------------
    def included(self) -> bool:
        """This rank is a member (False before the set is registered)."""
        return self.comm != MPI.COMM_NULL

    def rank(self) -> int:
        """This rank's index in the set (-1 where it is not a member)."""
        return self.comm.Get_rank() if self.included() else -1

    def size(self) -> int:
        return len(self.ranks) if self.ranks is not None else -1

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    # --- hpctrain's use ----------------------------------------------------------------------
    def auto_name(self, kind: str) -> str:
        """Horovod's automatic name: one count over every kind (as its handles), so ranks that
        disagreed on a kind and caught the error still agree on the next names."""
        n = self.counters.get("noname", 0)
        self.counters["noname"] = n + 1
        return f"{kind}.noname.{n}"

    def agree(self, sig: Sig) -> Verdict:
        """The set's coordinator's verdict on ``sig`` (raises the agreed error on every rank)."""
        assert self.coord is not None
        tl = T.active()
        if tl is None:
            return self.coord.agree(sig)
        t0 = time.perf_counter()
        verdict = self.coord.agree(sig)
        tl.negotiated(sig, t0)
        return verdict

    def set_rank_of(self, job_rank: int) -> int:
        """The index in this set of the job's rank ``job_rank`` (-1: not a member)."""
        assert self.ranks is not None
        return self.ranks.index(job_rank) if job_rank in self.ranks else -1

    def root_problem(self, root_rank) -> tuple[int, str]:
        """``root_rank`` (a rank of the job) as an int, and what is wrong with it as this set's
        root ("" if nothing)."""
        root = int(root_rank)
        if self.set_rank_of(root) < 0:
            where = "this job" if self.process_set_id == 0 else f"process set {self.process_set_id} ({self.ranks})"
            return root, f"root_rank {root} is not a rank of {where}"
        return root, ""

    def topology(self):
        """The set's node-local / inter-node topology (built once, for DistributedOptimizer)."""
        if self._topo is None:
            self._topo = Topology.create(self.comm, emulated_ranks_per_node())
        return self._topo

    def attach(self, set_id: int, ranks: list[int], comm: MPI.Comm, coord: Coordinator | None) -> None:
        self.process_set_id, self.ranks, self.comm, self.coord = set_id, ranks, comm, coord
        self.counters = {}

    def detach(self, free: bool) -> None:
        if free and self.process_set_id != 0:
            if self._topo is not None:
                self._topo.close()
            if self.coord is not None:
                self.coord.close()
            if self.comm != MPI.COMM_NULL:
                self.comm.Free()
        self._topo, self.coord, self.comm, self.process_set_id = None, None, MPI.COMM_NULL, None


global_process_set = ProcessSet()


def agree(sig: Sig) -> Verdict:
    """The global coordinator's verdict on ``sig`` (see :mod:`~hpctrain.horovod.coordinator`)."""
    state()
    return global_process_set.agree(sig)


def resolve(process_set) -> ProcessSet:
    """The registered set an operation runs on; one line where this rank cannot use it."""
    state()                                       # "not initialized" first
    ps = global_process_set if process_set is None else process_set
    if not isinstance(ps, ProcessSet):
        raise ValueError(f"hpctrain.horovod: process_set must be a hvd.ProcessSet, got {type(ps).__name__}")
    if ps.process_set_id is None:
        raise ValueError(f"hpctrain.horovod: {ps!r} is not registered; pass it to hvd.add_process_set "
                         "or hvd.init(process_sets=[...]) first")
    if not ps.included():
        raise ValueError(f"hpctrain.horovod: this rank is not a member of process set "
                         f"{ps.process_set_id} (ranks {ps.ranks})")
    return ps


def _own_ranks(ps: ProcessSet, comm: MPI.Comm) -> tuple | None:
    """The job's ranks of ``ps`` as this rank sees them (None: a communicator it is not in)."""
    if ps.mpi_comm is None:
        return tuple(ps.ranks or ())
    if ps.mpi_comm == MPI.COMM_NULL:
        return None
    group, job = ps.mpi_comm.Get_group(), comm.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), job)
    finally:
        group.Free()
        job.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        raise ValueError("hpctrain.horovod: ProcessSet(comm): the communicator holds processes "
                         "outside this Horovod job")
    return tuple(sorted(ranks))


def add_process_set(process_set) -> ProcessSet:
    """Register ``process_set`` (a :class:`ProcessSet` or a list of ranks) on every rank of the
    job (collective, same order everywhere); returns the registered set."""
    st = state()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"hpctrain.horovod: {ps!r} is already registered")
    mine = _own_ranks(ps, st.comm)
    problem = ""
    if mine is not None and (not mine or len(set(mine)) != len(mine)
                             or not all(0 <= r < st.topo.size for r in mine)):
        problem = f"ranks {list(mine)} must be distinct ranks of the job (0..{st.topo.size - 1})"
    verdict = agree(Sig("add_process_set", "add_process_set", extra=(ps.mpi_comm is not None, mine),
                        problem=problem))
    by_comm = verdict.extras[0][0]
    lists = [m for _, m in verdict.extras]
    if not by_comm and len(set(lists)) > 1:
        raise ValueError(f"hpctrain.horovod: add_process_set: ranks passed different rank lists "
                         f"({sorted(set(lists))}); every rank must pass the same")
    groups = sorted({m for m in lists if m is not None}, key=lambda m: m[0])
    taken = {tuple(s.ranks or ()) for s in st.process_sets.values()}
    if any(g in taken for g in groups):
        raise ValueError(f"hpctrain.horovod: a process set with ranks {[list(g) for g in groups if g in taken][0]} "
                         "is already registered")
    rank = st.topo.rank
    for g in groups:
        set_id = st.next_set_id
        st.next_set_id += 1
        comm = st.comm.Split(0 if rank in g else MPI.UNDEFINED, key=rank)
        target = ps if rank in g or (not by_comm and mine == g) else ProcessSet(list(g))
        coord = Coordinator(comm) if comm != MPI.COMM_NULL else None
        target.attach(set_id, list(g), comm, coord)
        st.process_sets[set_id] = target
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` on every rank (collective). Sets made from communicators may
    differ from rank to rank: every set named by any rank is removed. False for the global set
    or one not registered, as Horovod."""
    st = state()
    set_id = getattr(process_set, "process_set_id", None)
    verdict = agree(Sig("remove_process_set", "remove_process_set", extra=set_id or 0))
    for other in sorted({e for e in verdict.extras if e}):
        if other in st.process_sets:
            st.process_sets.pop(other).detach(free=True)
    return bool(set_id) and process_set.process_set_id is None
