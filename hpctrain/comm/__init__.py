"""Gradient synchronisation strategies, chosen by name (``comm.strategy``), composed with a wire
compression (``comm.compression``).

============  ==============================================================================
strategy      when to use it
============  ==============================================================================
auto          the default: ``hierarchical`` where some node holds more than one rank (and its
              ranks share memory), ``flat`` otherwise. ``describe()`` says what it chose.
flat          every rank a peer, per fusion bucket: MPI's allreduce or the ring, by a size
              rule (``ring.mpi_choice``: MPI up to 4 MiB) or measured at construction
              (``tune="measure"``, ``comm.tuner``). Use with one rank per node, on a uniform
              network, or as the reference.
hierarchical  many ranks per node: the node level sums through an MPI-3 shared-memory window
              (no messages), then one allreduce per slice across nodes. Use whenever nodes hold
              more than one rank; on a single node it is the fastest (pure memory traffic).
============  ==============================================================================

============  ==============================================================================
compression   when to use it
============  ==============================================================================
none          full-precision sums (fp32/fp64, within 1e-6 relative of MPI's Allreduce);
              the default.
fp16          bandwidth-bound networks: half the bytes on the wire, pre-divided by the world
              size, fp32 accumulation of partial sums; ~(n+1)·2^-11 relative error. Gradients
              are packed straight into the fp16 buffer and the mean unpacked straight into
              them (replacing the copies a full-precision bucket needs). Only what crosses
              the wire is compressed: buckets above 64 KiB, and nothing for ``hierarchical``
              on one node. On one host the "wire" is a memory copy and fp16 gains little
              (README). float32 gradients only.
============  ==============================================================================

``create(name, params, topology, *, bucket_bytes, compression="none", overlap=False)``; the
training loop calls ``grad_sync.allreduce_grads() -> found_inf`` or ``grad_sync.begin()`` /
``grad_sync.finish()``.
"""
from __future__ import annotations

from hpctrain.comm.base import GradSync
from hpctrain.comm.buckets import Bucket, make_buckets
from hpctrain.comm.collectives import allreduce_sum, average_tensors, broadcast_module, broadcast_tensors, checksum
from hpctrain.comm.compression import COMPRESSIONS
from hpctrain.comm.delay import DelayedSync, with_comm_delay
from hpctrain.comm.flat import FlatSync
from hpctrain.comm.hierarchical import HierarchicalSync, nodes_share_memory
from hpctrain.comm.strategies import STRATEGIES

# Importing flat and hierarchical (above, in this order) registered them; auto comes last.


def auto(params, topology, **kwargs) -> GradSync:
    """``hierarchical`` where some node holds more than one rank and they share memory, else
    ``flat`` (collective; every rank chooses alike)."""
    several = max(topology.node_sizes or (topology.local_size,)) > 1
    sync: GradSync
    if several and nodes_share_memory(topology):
        sync = HierarchicalSync(params, topology, **kwargs)
        sync.chosen_by = f"auto: {max(topology.node_sizes or (topology.local_size,))} ranks on a node"
    else:
        sync = FlatSync(params, topology, **kwargs)
        sync.chosen_by = "auto: one rank per node" if not several else "auto: no shared memory"
    return sync


STRATEGIES.register("auto")(auto)


def concrete() -> list[str]:
    """Names of the strategies that are algorithms (not selectors such as ``auto``), sorted."""
    return sorted(n for n, cls in STRATEGIES.items() if isinstance(cls, type))


def create(name: str, params, topology, **kwargs) -> GradSync:
    """Build the strategy called ``name`` (collective over ``topology.comm``).

    Keywords: ``bucket_bytes`` (fusion bucket size), ``compression`` (``none`` | ``fp16``) and
    ``compression_options`` (the codec's constructor keywords, ``[comm.<codec>]``),
    ``overlap`` (start bucket reductions from gradient hooks during backward), ``tune``
    (``static``: MPI's allreduce or the ring by a fixed size rule, the default here;
    ``measure``: time both per bucket now, :mod:`hpctrain.comm.tuner`; a job's default).
    A ValueError names the valid choices.
    """
    return STRATEGIES.get(name)(params, topology, **kwargs)


__all__ = ["Bucket", "GradSync", "make_buckets", "STRATEGIES", "COMPRESSIONS", "create",
           "FlatSync", "HierarchicalSync", "auto", "concrete",
           "allreduce_sum", "average_tensors", "broadcast_module", "broadcast_tensors", "checksum",
           "DelayedSync", "with_comm_delay"]
