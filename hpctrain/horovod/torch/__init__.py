"""``import hpctrain.horovod.torch as hvd``: Horovod's PyTorch API on hpctrain.

Names, signatures, defaults and semantics follow ``horovod.torch`` 0.28. What differs, and what
is refused (elastic, Adasum), is in docs/horovod.md; each refusal is one line naming the
alternative, where the feature is used. Launch with ``mpiexec``/``srun``/``jobs/`` instead of
``horovodrun``.

Modules, by what a Horovod user calls: :mod:`.basics` (``init``, ranks, ``barrier``, ``join``),
:mod:`.mpi_ops` and :mod:`.grouped_ops` (the tensor collectives), :mod:`.optimizer`
(``DistributedOptimizer``, ``Compression``), :mod:`.functions` (parameters, optimizer state and
objects), :mod:`.sync_batch_norm`; :mod:`.collectives` posts them on MPI. What does not touch
torch (the agreement, process sets, handles, timeline, exceptions) is in :mod:`hpctrain.horovod`.
"""
from __future__ import annotations

from hpctrain.horovod.errors import HorovodInternalError, HostsUpdatedInterrupt, unsupported
from hpctrain.horovod.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from hpctrain.horovod.torch.basics import (
    barrier,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hpctrain.horovod.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hpctrain.horovod.torch.grouped_ops import (
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
)
from hpctrain.horovod.torch.mpi_ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)
from hpctrain.horovod.torch.optimizer import Compression, Compressor, DistributedOptimizer
from hpctrain.horovod.torch.sync_batch_norm import SyncBatchNorm

_REFUSED = {
    "elastic": ("horovod.torch.elastic", "use checkpoints and resume (docs/operations.md)"),
}


def __getattr__(name: str):
    if name in _REFUSED:
        raise unsupported(*_REFUSED[name])
    raise AttributeError(f"module 'hpctrain.horovod.torch' has no attribute {name!r}")


__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
    "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "start_timeline", "stop_timeline",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async", "grouped_allgather",
    "grouped_allgather_async", "grouped_reducescatter", "grouped_reducescatter_async", "poll",
    "synchronize",
    "barrier", "join",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "DistributedOptimizer", "SyncBatchNorm", "Compression", "Compressor",
    "HorovodInternalError", "HostsUpdatedInterrupt",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
]
