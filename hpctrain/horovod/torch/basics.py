"""Horovod's process-wide calls: ``init``/``shutdown`` and the rank queries, on a hpctrain
:class:`~hpctrain.topology.Topology`.

``init`` duplicates the communicator (the script's own MPI traffic never meets Horovod's),
installs hpctrain's abort hook (an uncaught exception on any rank ends the job instead of leaving
the others blocked), builds the node-local / inter-node topology and the coordinator
(:mod:`.coordinator`). Horovod's environment variables are read here: the ones hpctrain cannot
honour are refused with one line, the tuning ones are mapped or named in one start-up line.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import torch
from mpi4py import MPI

from hpctrain.horovod.torch.coordinator import Coordinator, Sig, Verdict
from hpctrain.horovod.torch.errors import unsupported
from hpctrain.ops.abort import install_abort_hook
from hpctrain.topology import Topology, emulated_ranks_per_node

# Horovod's variables that change what a job does and that hpctrain does not do: refused.
REFUSED_ENV = {
    "HOROVOD_ELASTIC": "elastic training; use checkpoints and --resume (docs/operations.md)",
    "HOROVOD_TIMELINE": "Horovod's timeline; use hpctrain's timeline (docs/operations.md)",
    "HOROVOD_PROCESS_SETS": "process sets; run one job per group of ranks",
}
# Tuning variables: hpctrain fuses, orders and tunes by itself; a start-up line says so.
NOTED_ENV = {
    "HOROVOD_CYCLE_TIME": "no background cycle: collectives start when submitted",
    "HOROVOD_CACHE_CAPACITY": "no response cache: each collective is agreed once when submitted",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "gradients are hierarchical by default where a node holds several ranks",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "allgather is MPI's",
    "HOROVOD_AUTOTUNE": "hpctrain measures its collectives at start-up (comm.tune=measure)",
    "HOROVOD_TORCH_NUM_GROUPS": "gradients are fused into buckets (HOROVOD_FUSION_THRESHOLD)",
}


@dataclass
class State:
    comm: MPI.Comm                  # hpctrain.horovod's own duplicate of the user's communicator
    topo: Topology
    coord: Coordinator
    counters: dict = field(default_factory=dict)     # auto names: kind -> next index
    optimizers: dict = field(default_factory=dict)   # id -> DistributedOptimizer (join mirrors)

    def auto_name(self, kind: str) -> str:
        n = self.counters.get(kind, 0)
        self.counters[kind] = n + 1
        return f"{kind}.noname.{n}"


_state: State | None = None


def state() -> State:
    if _state is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _state


def init(comm=None, process_sets=None) -> None:
    """Start hpctrain.horovod on ``comm`` (an mpi4py communicator; default ``MPI.COMM_WORLD``).
    A second call is a no-op, as in Horovod."""
    global _state
    if _state is not None:
        return
    if process_sets:
        raise unsupported("process_sets", "run one job per group of ranks, or pass an mpi4py "
                          "communicator of the ranks to init(comm=...)")
    if comm is not None and not isinstance(comm, MPI.Comm):
        raise unsupported(f"init(comm={type(comm).__name__})", "pass an mpi4py communicator "
                          "(e.g. MPI.COMM_WORLD.Split(...)) instead of a list of ranks")
    for name, what in REFUSED_ENV.items():
        if os.environ.get(name, "") not in ("", "0"):
            raise unsupported(f"{name} ({what.split(';')[0]})", what.split("; ", 1)[1])
    base = MPI.COMM_WORLD if comm is None else comm
    install_abort_hook(base)
    own = base.Dup()
    topo = Topology.create(own, emulated_ranks_per_node())
    from hpctrain.horovod.torch.mpi_ops import refuse_joined
    _state = State(comm=own, topo=topo, coord=Coordinator(own, refuse_joined))
    noted = [f"{k} ({v})" for k, v in NOTED_ENV.items() if os.environ.get(k)]
    if noted and topo.rank == 0:
        sys.stderr.write("hpctrain.horovod: not used: " + "; ".join(noted) + "\n")


def shutdown() -> None:
    """Free hpctrain.horovod's communicators (collective). ``init`` may be called again."""
    global _state
    if _state is None:
        return
    s, _state = _state, None
    for opt in list(s.optimizers.values()):
        opt.close()
    s.coord.close()
    s.topo.close()
    s.comm.Free()


def is_initialized() -> bool:
    return _state is not None


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
    raise unsupported("start_timeline", "use hpctrain's timeline (docs/operations.md)")


def stop_timeline() -> None:
    raise unsupported("stop_timeline", "use hpctrain's timeline (docs/operations.md)")


def agree(sig: Sig) -> Verdict:
    """The coordinator's verdict on ``sig`` (see :mod:`.coordinator`)."""
    return state().coord.agree(sig)
