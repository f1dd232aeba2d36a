"""Horovod's process-wide calls: ``init``/``shutdown`` and the rank queries, on a hpctrain
:class:`~hpctrain.topology.Topology`.

``init`` duplicates the communicator (the script's own MPI traffic never meets Horovod's),
installs hpctrain's abort hook (an uncaught exception on any rank ends the job instead of leaving
the others blocked), builds the node-local / inter-node topology, the global process set's
coordinator (:mod:`hpctrain.horovod.coordinator`) and any process sets passed in. No Horovod environment variable
stops a job: ``HOROVOD_TIMELINE`` starts the timeline (:mod:`hpctrain.horovod.timeline`), the stall and fusion
variables are honoured, and every other ``HOROVOD_*`` variable is named in one line on rank 0 as
not used. A feature hpctrain does not have is refused where it is called.

``barrier`` and ``join``: a joined rank takes part in the others' reductions until all join. As
in Horovod, while some rank has joined the others may still allreduce (joined ranks add the op's
identity: zeros to sums; an ``Average`` still divides by every rank), run optimizer steps (joined
ranks add zero gradients) and barriers; any other collective (allgather, broadcast, alltoall,
reducescatter, the object helpers) raises on the ranks that asked for it, while the joined rank
waits on in ``join``.
"""
from __future__ import annotations

import os
import sys

import torch
from mpi4py import MPI

from hpctrain.horovod import timeline as T
from hpctrain.horovod.coordinator import Coordinator, Sig
from hpctrain.horovod.handles import drain
from hpctrain.horovod.process_sets import (
    State,
    add_process_set,
    global_process_set,
    is_initialized,
    resolve,
    set_state,
    state,
)
from hpctrain.horovod.torch import collectives as C
from hpctrain.ops.abort import install_abort_hook
from hpctrain.topology import Topology, emulated_ranks_per_node

# Variables hpctrain reads (the rest of HOROVOD_* is named at start-up as not used).
USED_ENV = ("HOROVOD_TIMELINE", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_STALL_CHECK_TIME_SECONDS",
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
# Why a variable is not needed, where there is more to say than "not used".
NOTED_ENV = {
    "HOROVOD_CYCLE_TIME": "no background cycle: collectives start when submitted",
    "HOROVOD_CACHE_CAPACITY": "no response cache: each collective is agreed once when submitted",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "gradients are hierarchical by default where a node holds several ranks",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "allgather is MPI's",
    "HOROVOD_AUTOTUNE": "hpctrain measures its collectives at start-up (comm.tune=measure)",
    "HOROVOD_TORCH_NUM_GROUPS": "gradients are fused into buckets (HOROVOD_FUSION_THRESHOLD)",
    "HOROVOD_ELASTIC": "elastic training is not available; hvd.elastic is refused where used",
    "HOROVOD_DYNAMIC_PROCESS_SETS": "process sets can always be added and removed",
    "HOROVOD_TIMELINE_MARK_CYCLES": "pass mark_cycles to hvd.start_timeline",
}


def unused_env(environ) -> list[str]:
    """The ``HOROVOD_*`` variables set in ``environ`` that hpctrain does not use, each with why."""
    return [f"{k} ({NOTED_ENV[k]})" if k in NOTED_ENV else k for k in sorted(environ)
            if k.startswith("HOROVOD_") and k not in USED_ENV and environ[k] != ""]


def init(comm=None, process_sets=None) -> None:
    """Start hpctrain.horovod on ``comm`` (an mpi4py communicator, or a list of ranks of
    ``MPI.COMM_WORLD``; default ``MPI.COMM_WORLD``); register ``process_sets`` (collective).
    A second call is a no-op, as in Horovod."""
    if is_initialized():
        return
    base = MPI.COMM_WORLD if comm is None else comm
    if isinstance(comm, (list, tuple, range)):
        ranks = sorted(int(r) for r in comm)
        world = MPI.COMM_WORLD
        if world.Get_rank() not in ranks:
            raise ValueError(f"hpctrain.horovod: init(comm={ranks}): rank {world.Get_rank()} is "
                             "not in the list; call hvd.init on those ranks only")
        group = world.Get_group()
        sub = group.Incl(ranks)
        base = world.Create_group(sub)          # collective over the listed ranks only
        sub.Free()
        group.Free()
    elif not isinstance(base, MPI.Comm):
        raise ValueError(f"hpctrain.horovod: init(comm=...) takes an mpi4py communicator or a list of "
                         f"ranks, got {type(comm).__name__}")
    install_abort_hook(base)
    own = base.Dup()
    if base is not comm and base is not MPI.COMM_WORLD:
        base.Free()                             # made here from a list of ranks: own is its copy
    topo = Topology.create(own, emulated_ranks_per_node())
    coord = Coordinator(own, refuse_joined)
    set_state(State(comm=own, topo=topo, coord=coord, process_sets={0: global_process_set}))
    global_process_set.attach(0, list(range(topo.size)), own, coord)
    noted = unused_env(os.environ)
    if noted and topo.rank == 0:
        sys.stderr.write("hpctrain.horovod: not used: " + "; ".join(noted) + "\n")
    timeline = os.environ.get("HOROVOD_TIMELINE", "")
    if timeline and timeline != "DYNAMIC":
        T.start(timeline, os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES", "") not in ("", "0"), topo.rank)
    for ps in process_sets or ():
        add_process_set(ps)


def shutdown() -> None:
    """Free hpctrain.horovod's communicators (collective). ``init`` may be called again."""
    if not is_initialized():
        return
    drain()                 # no request may outlive the communicators freed below
    T.stop()
    s = state()
    for opt in list(s.optimizers.values()):
        opt.close()
    for set_id in sorted(s.process_sets, reverse=True):
        s.process_sets.pop(set_id).detach(free=True)
    set_state(None)
    s.coord.close()
    s.topo.close()
    s.comm.Free()


def size() -> int:
    return state().topo.size


def rank() -> int:
    return state().topo.rank


def local_size() -> int:
    return state().topo.local_size


def local_rank() -> int:
    return state().topo.local_rank


def cross_size() -> int:
    """Nodes that hold a rank with this rank's local index."""
    return state().topo.inter.Get_size()


def cross_rank() -> int:
    """This rank's node among those (``topology.inter``)."""
    return state().topo.inter.Get_rank()


def is_homogeneous() -> bool:
    """Every node holds the same number of ranks."""
    sizes = state().topo.node_sizes
    return len(set(sizes)) <= 1


def mpi_threads_supported() -> bool:
    state()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """0: no NCCL (Horovod returns the NCCL version it was built with, else 0)."""
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    """True with a CUDA build of torch: CUDA tensors are accepted (staged through host memory,
    or handed to a CUDA-aware MPI by the gradient path)."""
    return torch.version.cuda is not None


def rocm_built() -> bool:
    return False


def start_timeline(file_path, mark_cycles=False) -> None:
    """Record a Chrome-trace timeline of every collective at ``file_path`` (written by rank 0
    when it stops; a second call moves it to a new file)."""
    T.start(str(file_path), mark_cycles, state().topo.rank)


def stop_timeline() -> None:
    """Stop the timeline and write its file."""
    state()
    T.stop()


# --- barrier and join -----------------------------------------------------------------------
MIRRORED = ("allreduce", "grouped_allreduce", "barrier", "grad")


def barrier(process_set=global_process_set) -> None:
    """Wait until every member of the set has reached the barrier."""
    ps = resolve(process_set)
    ps.agree(Sig("barrier", "barrier"))
    C.post_barrier(ps.comm).wait()


def join(device=-1) -> int:
    """This rank has no more data: until every rank has joined, take part in the others'
    reductions with a neutral contribution. Returns the rank that joined last."""
    ps = resolve(global_process_set)
    while True:
        verdict = ps.agree(Sig("join", "join"))
        if verdict.last_joined >= 0:
            return verdict.last_joined
        for name in verdict.names or ((verdict.sig.name,) if verdict.sig is not None else ()):
            _follow_auto_name(name)
        if verdict.error is None:             # else the others raise theirs; this rank waits on
            _mirror(verdict)


def _mirror(verdict) -> None:
    """A joined rank's part in the collective ``verdict.sig`` the active ranks run."""
    sig, comm = verdict.sig, global_process_set.comm
    op = {v: k for k, v in C.OP_NAMES.items()}.get(sig.op, C.Sum)
    if sig.kind == "allreduce":
        t = C.neutral(op, getattr(torch, sig.dtype), sig.shape)
        C.post_allreduce(comm, t, t, op).wait()
    elif sig.kind == "grouped_allreduce":
        ts = [C.neutral(op, getattr(torch, d), s) for d, s in zip(sig.dtype.split(","), sig.shape)]
        C.post_grouped_allreduce(comm, ts, ts, op).wait()
    elif sig.kind == "barrier":
        C.post_barrier(comm).wait()
    elif sig.kind == "grad":
        state().optimizers[sig.name].mirror_round()


def _follow_auto_name(name: str) -> None:
    """A joined rank does not make the unnamed calls the others make (failed ones included):
    advance its counter past theirs, so automatic names (``allreduce.noname.N``) still agree once
    every rank has joined."""
    _, sep, number = name.rpartition(".noname.")
    if sep and number.isdigit():
        counters = global_process_set.counters
        counters["noname"] = max(counters.get("noname", 0), int(number) + 1)


def refuse_joined(sig: Sig, joined: tuple) -> str | None:
    """Why ``sig`` cannot run while ``joined`` ranks have joined (None: it can)."""
    if sig.kind in MIRRORED:
        return None
    return "as in Horovod, only allreduce, grouped_allreduce, barrier and optimizer steps run while a rank has joined"
