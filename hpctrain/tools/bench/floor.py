"""The physical floor of a training step: what no software can remove on this machine.

    floor = compute + memory traffic the strategy must cause / copy rate + unavoidable syncs

* **compute**: forward, backward, ``zero_grad`` and the optimiser step, as the same run's budget
  measured them (:mod:`hpctrain.tools.bench.budget`): the work of the no-communication floor.
* **memory traffic**, in *copies of the gradient* (one copy reads and writes each byte once), per
  rank and step, counted from the bucket sizes by :func:`copies_per_step`, at the rate one
  ``copy_`` between the largest bucket's own two buffers reaches while every rank copies at once
  (:func:`copy_rate`: the same run, the same buffers, memory shared as in training).
* **syncs**: the synchronisations the strategy cannot avoid, each at the latency measured on the
  same communicators (:func:`sync_latency`): ``hierarchical`` two node barriers per bucket (the
  gradients are in the window; the means are complete), ``flat`` one allreduce per bucket.

Which bytes each strategy must move, per rank, gradient bytes ``G``, ``n`` ranks on the node:

================  =================================================================================
hierarchical      ``G``: each rank reads its 1/n slice of every rank's gradients (G) and writes the
                  slice's mean into every rank's output (G): one copy. Nothing else: the gradients
                  already live in the window and ``p.grad`` is rebound to the mean, not copied.
flat              ``3.5 (n-1)/n G``: a ring through memory: 2(n-1)/n G of messages, each one copy
                  (a single-copy shared-memory transport), and (n-1)/n G of adds, each reading two
                  operands and writing one (1.5 copies).
+fp16 (flat)      messages and adds on half the bytes, plus the pack (reads G, writes G/2: 0.75)
                  and the unpack (0.75).
================  =================================================================================

Across nodes the network is not modelled (no link bandwidth is measured here): the floor then
holds the node part only and says so.
"""
from __future__ import annotations

import statistics
import time

import torch
from mpi4py import MPI

PACK_COPIES = 0.75      # fp32 -> fp16: reads G, writes G/2 (in copies of G)


def copies_per_step(strategy: str, bucket_bytes: list[int], local_size: int, compressed: list[bool]) -> float:
    """Gradient bytes the strategy must move through memory per rank and step, in bytes of copy
    traffic (one copy of ``b`` bytes counts ``b``); ``compressed[i]``: bucket i travels as fp16."""
    n = local_size
    if n <= 1:
        return 0.0
    share = (n - 1) / n
    total = 0.0
    for b, fp16 in zip(bucket_bytes, compressed):
        if strategy == "hierarchical":
            total += b
        elif fp16:
            total += 3.5 * share * b / 2 + 2 * PACK_COPIES * b
        else:
            total += 3.5 * share * b
    return total


def syncs_per_step(strategy: str, n_buckets: int, world_size: int) -> int:
    """Synchronisations the strategy cannot avoid per step (0 for one rank)."""
    if world_size == 1:
        return 0
    return 2 * n_buckets if strategy == "hierarchical" else n_buckets


def copy_rate(comm: MPI.Comm, src: torch.Tensor, dst: torch.Tensor, repeats: int = 5) -> float:
    """Bytes per second of ``dst.copy_(src)`` while every rank of ``comm`` copies at once (the
    slowest rank's median). Overwrites ``dst``."""
    n_bytes = src.numel() * src.element_size()
    times = []
    for _ in range(repeats + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return n_bytes / max(statistics.median(times[1:]), 1e-9)


def sync_latency(comm: MPI.Comm, strategy: str, repeats: int = 50) -> float:
    """Seconds of one unavoidable synchronisation on ``comm``: an empty barrier
    (``hierarchical``) or an allreduce of one byte (``flat``); the median, slowest rank."""
    one = bytearray(1)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        if strategy == "hierarchical":
            comm.Barrier()
        else:
            comm.Allreduce(MPI.IN_PLACE, [one, MPI.BYTE], op=MPI.MAX)
        times.append(time.perf_counter() - t0)
    return comm.allreduce(statistics.median(times[1:]), op=MPI.MAX)


def floor_of(sync, compute_s: float) -> dict:
    """The floor of a step of the gradient sync ``sync`` (collective over its communicators;
    between rounds: it writes the largest bucket's input buffer): ``compute_s`` plus its memory
    traffic and syncs, each part and what it assumed."""
    strategy, topo = sync.name, sync.topo
    buckets = sync.buckets
    sizes = [b.n_elems * b.bufs[0].element_size() for b in buckets]
    fp16 = [b.wire.buf is not None for b in buckets]
    local = topo.local_size if strategy == "hierarchical" or topo.n_nodes == 1 else 1
    moved = copies_per_step(strategy, sizes, local, fp16) if topo.comm.Get_size() > 1 else 0.0
    biggest = max(buckets, key=lambda b: b.n_elems) if buckets else None
    # out -> flat: after a finished round ``flat`` (this rank's own gradients) is free, ``out``
    # (the means, where p.grad points) is kept
    rate = copy_rate(topo.intra, biggest.out, biggest.flat) if biggest is not None and biggest.n_elems else 0.0
    # the strategy's own communicators (its first bucket's: a Dup of the node's or of all ranks')
    own = [h for h in sync.handles() if isinstance(h, MPI.Comm)]
    latency = sync_latency(own[0] if own else topo.intra if strategy == "hierarchical" else topo.comm, strategy)
    n_syncs = syncs_per_step(strategy, len(buckets), topo.comm.Get_size())
    transfer_s = moved / rate if rate else 0.0
    return {"compute_ms": compute_s * 1e3, "bytes_moved": moved, "gradient_bytes": sum(sizes),
            "copy_GBps": rate / 1e9, "transfer_ms": transfer_s * 1e3, "syncs": n_syncs,
            "sync_latency_us": latency * 1e6, "sync_ms": n_syncs * latency * 1e3,
            "floor_ms": (compute_s + transfer_s + n_syncs * latency) * 1e3,
            "network": "not modelled" if topo.n_nodes > 1 else "one node"}
