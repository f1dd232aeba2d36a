"""``import hpctrain.horovod.torch as hvd`` gives Horovod's PyTorch names, wherever in the package
they are defined: the list below is what scripts written for ``horovod.torch`` 0.28 call, so a
module moved or merged inside the package cannot drop or add one unnoticed."""
import types

import hpctrain.horovod.torch as hvd

HOROVOD_NAMES = """
init shutdown is_initialized size rank local_size local_rank cross_size cross_rank is_homogeneous
mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built
cuda_built rocm_built start_timeline stop_timeline
Average Sum Adasum Min Max Product
allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_
grouped_allreduce_async grouped_allreduce_async_ allgather allgather_async grouped_allgather
grouped_allgather_async broadcast broadcast_ broadcast_async broadcast_async_ alltoall alltoall_async
reducescatter reducescatter_async grouped_reducescatter grouped_reducescatter_async poll synchronize
barrier join
broadcast_parameters broadcast_optimizer_state broadcast_object allgather_object
DistributedOptimizer SyncBatchNorm Compression Compressor HorovodInternalError HostsUpdatedInterrupt
ProcessSet global_process_set add_process_set remove_process_set
""".split()


def test_all_is_horovods_names_and_each_resolves():
    assert sorted(hvd.__all__) == sorted(HOROVOD_NAMES)
    for name in HOROVOD_NAMES:
        assert getattr(hvd, name) is not None, name


def test_nothing_public_beyond_all():
    """Besides ``__all__`` the package shows only its submodules and the one-line refusal helper."""
    public = {n for n in dir(hvd) if not n.startswith("_") and not isinstance(getattr(hvd, n), types.ModuleType)}
    assert public - set(HOROVOD_NAMES) == {"annotations", "unsupported"}


def test_functions_are_callable_with_horovods_signatures():
    """A few signatures scripts pass by keyword (Horovod 0.28's parameter names)."""
    import inspect
    params = {f: list(inspect.signature(getattr(hvd, f)).parameters) for f in
              ("allreduce", "broadcast_parameters", "broadcast_optimizer_state", "init")}
    assert params["allreduce"] == ["tensor", "average", "name", "compression", "op", "prescale_factor",
                                   "postscale_factor", "process_set"]
    assert params["broadcast_parameters"] == ["params", "root_rank", "process_set"]
    assert params["broadcast_optimizer_state"] == ["optimizer", "root_rank", "model", "process_set"]
    assert params["init"] == ["comm", "process_sets"]
