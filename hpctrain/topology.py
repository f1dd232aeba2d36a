"""Where each rank sits: world, node-local and inter-node communicators, computed once.

Real nodes come from ``Split_type(COMM_TYPE_SHARED)`` (ranks that can share memory). For tests and
studies on one host, ``ranks_per_node=K`` *emulates* K ranks per node by splitting on ``rank // K``
(the last node may be smaller). The inter-node communicator joins ranks with the same local index
(ChainerMN's ``init_ranks`` idea; a two-dimensional layout), so every local rank drives its own
share of the inter-node traffic.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from mpi4py import MPI


def emulated_ranks_per_node() -> int:
    """``HPCTRAIN_RANKS_PER_NODE`` (0 where unset): emulated nodes for tests and studies on one
    host, for entry points that take no config (``hpctrain.horovod``, ``hpctrain.ddp``)."""
    return int(os.environ.get("HPCTRAIN_RANKS_PER_NODE", "0") or 0)


@dataclass(frozen=True)
class Topology:
    comm: MPI.Comm          # the training communicator (world for this job)
    intra: MPI.Comm         # ranks on my node
    inter: MPI.Comm         # ranks on other nodes with my local rank
    rank: int
    size: int
    local_rank: int
    local_size: int
    node: int               # my node's index, 0..n_nodes-1
    n_nodes: int
    emulated: bool          # True when nodes are emulated by ranks_per_node
    node_sizes: tuple = ()  # ranks on each node, by node index (the last may be smaller)
    host_local_rank: int = -1   # my rank on my physical host (-1: local_rank; differs when emulated)

    @property
    def physical_local_rank(self) -> int:
        """My index among the ranks of my physical host (GPU binding), whatever the emulation."""
        return self.local_rank if self.host_local_rank < 0 else self.host_local_rank

    @property
    def min_local_size(self) -> int:
        """Ranks on the smallest node: how many local ranks have a peer on every node."""
        return min(self.node_sizes) if self.node_sizes else self.local_size

    @classmethod
    def create(cls, comm: MPI.Comm, ranks_per_node: int = 0) -> Topology:
        """Split ``comm`` into node-local and inter-node communicators (collective)."""
        rank, size = comm.Get_rank(), comm.Get_size()
        host_local_rank = -1
        if ranks_per_node and ranks_per_node > 0:
            intra = comm.Split(color=rank // ranks_per_node, key=rank)
            host = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)     # the real host's ranks
            host_local_rank = host.Get_rank()
            host.Free()
        else:
            intra = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        local_rank, local_size = intra.Get_rank(), intra.Get_size()
        # A node's index: order nodes by their lowest world rank.
        leader = intra.bcast(rank, root=0)
        all_leaders = comm.allgather(leader)
        leaders = sorted(set(all_leaders))
        node = leaders.index(leader)
        inter = comm.Split(color=local_rank, key=node)
        return cls(comm=comm, intra=intra, inter=inter, rank=rank, size=size,
                   local_rank=local_rank, local_size=local_size, node=node,
                   n_nodes=len(leaders), emulated=bool(ranks_per_node),
                   node_sizes=tuple(all_leaders.count(ld) for ld in leaders),
                   host_local_rank=host_local_rank)

    def close(self) -> None:
        """Free the split communicators (the world communicator is the caller's)."""
        for c in (self.intra, self.inter):
            if c != MPI.COMM_NULL:
                c.Free()

    def describe(self) -> str:
        kind = "emulated" if self.emulated else "shared-memory"
        return (f"{self.size} ranks on {self.n_nodes} node(s) ({kind}), "
                f"{self.local_size} local ranks on node {self.node}")
