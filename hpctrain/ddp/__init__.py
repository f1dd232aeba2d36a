"""torch DDP on hpctrain: a rendezvous-free start under MPI and a communication hook.

A DDP script gains two lines::

    import hpctrain.ddp
    hpctrain.ddp.init_process_group()                 # instead of dist.init_process_group(...)
    ...
    model = DDP(model)
    hpctrain.ddp.register(model)                      # DDP's buckets reduced by hpctrain

and runs under ``mpiexec``, ``mpiexec.mpich`` or ``srun`` without MASTER_ADDR/MASTER_PORT
(:mod:`.process_group`); its gradient buckets are averaged by hpctrain's strategies
(shared-memory ``hierarchical`` on a node with several ranks) and codecs (fp16 wire)
(:mod:`.hook`). docs/ddp.md has the details.
"""
from hpctrain.ddp.hook import HookState, HookStateError, allreduce_hook, register
from hpctrain.ddp.process_group import (
    RendezvousError,
    default_backend,
    destroy_process_group,
    init_process_group,
    local_rank,
    local_size,
    rank,
    size,
    topology,
)

__all__ = ["init_process_group", "destroy_process_group", "rank", "size", "local_rank", "local_size",
           "topology", "default_backend", "HookState", "allreduce_hook", "register",
           "RendezvousError", "HookStateError"]
