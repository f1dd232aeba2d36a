"""Helpers for user scripts: ``init``, metric reduction and a shard loader factory.

``mpiexec -n N python my_train.py`` with::

    topo = hpctrain.init()                                   # instead of hvd.init()
    trainer = hpctrain.DistributedTrainer(model, opt, topo)  # instead of DistributedOptimizer / DDP
    for x, y in hpctrain.shard_loader("data/mine", topo, batch_size=256).epoch(epoch):
        trainer.step(x, y)
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from mpi4py import MPI

from hpctrain.comm.collectives import allreduce_sum, broadcast_module
from hpctrain.data import ShardLoader, ShardSet, eval_batches, read_index
from hpctrain.errors import ConfigError
from hpctrain.ops import gpu_bind
from hpctrain.ops.abort import install_abort_hook
from hpctrain.topology import Topology


def init(comm: MPI.Comm | None = None, ranks_per_node: int = 0, threads: int | None = 1,
         abort_on_error: bool = True) -> Topology:
    """Set up a rank: topology (node-local / inter-node communicators), abort hook, threads.

    ``comm`` defaults to ``MPI.COMM_WORLD`` (a script is an entry point); ``ranks_per_node``
    emulates nodes on one host. With ``abort_on_error`` an uncaught exception on any rank ends
    the whole job instead of leaving the other ranks blocked.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    if abort_on_error:
        install_abort_hook(comm)
    if threads:
        torch.set_num_threads(threads)
    topo = Topology.create(comm, ranks_per_node)
    bind_device(topo)
    return topo


DEVICES = ("auto", "cpu", "cuda")
"""Values of ``train.device`` (:func:`bind_device`'s ``want``)."""


def bind_device(topo: Topology, want: str = "auto") -> torch.device:
    """The device this rank trains on, made current: ``cuda:<local rank mod visible GPUs>``
    for ``"cuda"``, and for ``"auto"`` when torch sees CUDA (after jobs/common/bind.sh only one
    GPU is visible, so that is index 0); else ``"cpu"``. Several ranks of a node may share a
    GPU when there are fewer GPUs than ranks. ``"cuda"`` without a CUDA device is a
    :class:`ConfigError`.

    The local rank is the rank on the *physical* host: the launcher's (as
    :func:`hpctrain.ops.gpu_bind.early_bind` used before MPI started, so both choose alike), else
    the shared-memory split's; never the emulated ``comm.ranks_per_node`` layout. A script binds
    before MPI initialises with ``hpctrain.ops.gpu_bind.early_bind("auto")`` ahead of its first
    ``import mpi4py.MPI`` / ``hpctrain.api``; the CLI does."""
    if want not in DEVICES:
        raise ConfigError(f"config train.device: must be one of {' | '.join(DEVICES)}, got {want!r}")
    if want == "cpu" or (want == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("config train.device: cuda, but torch sees no CUDA device "
                          f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
                          "use auto or cpu")
    local = gpu_bind.launcher_local_rank()
    local = topo.physical_local_rank if local is None else local
    index = gpu_bind.device_index(local, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def broadcast_parameters(model: torch.nn.Module, comm: MPI.Comm, root: int = 0) -> None:
    """Make every rank's parameters and buffers equal to ``root``'s."""
    broadcast_module(model, comm, root)


def allreduce_metrics(metrics: dict, comm: MPI.Comm, average: bool = True) -> dict:
    """Sum (or average) a dict of scalar metrics over ranks; every rank gets the result."""
    keys = sorted(metrics)
    total = allreduce_sum([float(metrics[k]) for k in keys], comm)
    if average:
        total = total / comm.Get_size()
    return dict(zip(keys, total.tolist()))


def shard_loader(directory: str, topology: Topology, batch_size: int, *, split: str = "train",
                 seed: int = 0, **options) -> ShardLoader:
    """Per-rank training batches of ``batch_size`` (per rank) from any shard directory."""
    # checksums checked together over the ranks; files read per rank (serial driver), so a script
    # that never closes the loader leaves nothing collective to tear down at exit
    shards = ShardSet(read_index(directory), split, comm=topology.comm, driver="serial")
    shards.check()
    return ShardLoader(shards, rank=topology.rank, size=topology.size, batch_size=batch_size,
                       seed=seed, **options)


def shard_eval_batches(directory: str, topology: Topology, batch_size: int = 256,
                       split: str = "test") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's contiguous share of an evaluation split."""
    shards = ShardSet(read_index(directory), split, comm=topology.comm, driver="serial")
    return eval_batches(shards, rank=topology.rank, size=topology.size, batch_size=batch_size)
