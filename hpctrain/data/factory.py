"""Build the training loader and the evaluation split from the data options, for the CLI job
(``hpctrain.job``).

The options are the fields of ``[data]``, passed by name (the job passes each field named as a
keyword of :func:`train_loader`, so a new data option is its field and its keyword, nothing
here); this module never sees the config. ``reader="node"``: the node's local
rank 0 opens the training shards — collectively over the node readers (``Topology.inter`` of
local rank 0) with ``mpio`` — and fills the shared window; the other ranks never open them.
Evaluation splits are read by every rank.
"""
from __future__ import annotations

from hpctrain.data import gpudecode
from hpctrain.data.augment import KINDS, Augment
from hpctrain.data.decodepool import affinity, resolve_workers
from hpctrain.data.hdf5 import DRIVERS
from hpctrain.data.index import ShardError, ShardIndex
from hpctrain.data.loader import ShardLoader
from hpctrain.data.memory import check_loader_memory
from hpctrain.data.plan import lane_problem
from hpctrain.data.shards import ShardSet
from hpctrain.errors import ConfigError

READERS = ("rank", "node")
DECODES = ("auto", "cpu", "gpu")


def _check(key: str, value: str, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"config data.{key}: expected one of {' | '.join(allowed)}, got {value!r}")


def open_split(index: ShardIndex, split: str, topo, *, driver: str = "auto", verify: str = "shared") -> ShardSet:
    """A split every rank reads (evaluation); the open (``mpio``) and the checksum pass are
    collective over ``topo.comm``."""
    _check("hdf5_driver", driver, DRIVERS)
    return ShardSet(index, split, comm=topo.comm, driver=driver, verify=verify)


def _node_reader_shards(index: ShardIndex, split: str, topo, driver: str, verify: str) -> ShardSet:
    """Local rank 0 opens and checks the shards over the node readers (``topo.inter``); its
    verdict is broadcast on the node, so a bad shard stops the other local ranks too instead of
    leaving them waiting for the window."""
    error, shards = None, None
    if topo.local_rank == 0:
        try:
            shards = ShardSet(index, split, comm=topo.inter, driver=driver, verify=verify)
            shards.check()
        except ShardError as exc:
            error = str(exc)
    error = topo.intra.bcast(error, root=0)
    if error is not None:
        raise ShardError(error)
    if shards is None:                         # never read on this rank; the node reader checked it
        shards = ShardSet(index, split, driver="serial", verify="off")
    return shards


def train_loader(index: ShardIndex, topo, *, batch_size: int, seed: int = 0, block_size: int = 32,
                 shuffle_window: int = 1024, prefetch: int = 2, drop_last: bool = True, augment: bool = False,
                 augment_kind: str = "auto", augment_flip: bool = True, reader: str = "rank",
                 hdf5_driver: str = "auto", verify: str = "shared", split: str = "train",
                 raw: bool = False, workers: int = 0, decode: str = "auto", lanes: int = 0) -> ShardLoader:
    """The per-rank training loader (``batch_size`` per rank). Collective over ``topo.comm``.

    ``raw``: batches as stored, normalised by the consumer on its device (``loader.batch_prep``);
    the job asks for them when it trains on a GPU.

    ``workers``: JPEG decode threads (0: :func:`decodepool.default_workers` for this rank, from its
    CPU affinity and those of the node's ranks, allgathered over ``topo.intra``; the node reader
    keeps all its cores). ``decode``: where JPEG batches are decoded (``auto``:
    on the GPU when ``raw`` batches go to CUDA and torchvision imports; :mod:`gpudecode`).

    ``lanes``: the lanes the epoch's sequence is dealt to (0: one per rank); fixed, the run is
    the same at any rank count that divides it (:class:`ShardLoader`).

    ``loader.close()`` stops its threads, frees the node window and closes the shards (all
    collective where the parts are); ``loader.describe()`` is the start-up log line.
    """
    _check("reader", reader, READERS)
    _check("hdf5_driver", hdf5_driver, DRIVERS)
    _check("augment_kind", augment_kind, KINDS)
    _check("decode", decode, DECODES)
    if index.encoding == "jpeg":      # data.decode=gpu that cannot work: one line before any shard is opened
        gpudecode.resolve(decode, raw=raw, whole=index.stored == "whole", node=reader == "node")
    problem = lane_problem(lanes or topo.size, topo.size, batch_size * topo.size)
    if problem:
        raise ConfigError(f"config data.lanes: {problem}")
    mine = affinity()
    masks = topo.intra.allgather(sorted(mine))        # collective on every rank, whatever workers says
    node_reader = reader == "node" and topo.local_rank == 0     # decodes for the whole node
    n_workers = resolve_workers(workers, mine, masks, node_reader=node_reader)
    per_rank = (lanes or topo.size) // topo.size        # lanes this rank reads, each with its window
    check_loader_memory(index, batch_size=batch_size,
                        shuffle_window=per_rank * max(shuffle_window, batch_size // per_rank), prefetch=prefetch,
                        local_size=getattr(topo, "local_size", 1), split=split)   # before anything is opened
    if reader == "node":
        shards, node_comm = _node_reader_shards(index, split, topo, hdf5_driver, verify), topo.intra
    else:
        shards, node_comm = ShardSet(index, split, comm=topo.comm, driver=hdf5_driver, verify=verify), None
        shards.check()
    transform = Augment(augment_kind, flip=augment_flip) if augment else None
    loader = ShardLoader(shards, rank=topo.rank, size=topo.size, batch_size=batch_size, seed=seed,
                         block_size=block_size, shuffle_window=shuffle_window, prefetch=prefetch,
                         drop_last=drop_last, transform=transform, node_comm=node_comm, raw=raw,
                         workers=n_workers, decode=decode, lanes=lanes)
    loader.owns_shards = True
    return loader
