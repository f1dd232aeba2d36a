"""Hierarchical strategy: a shared-memory level inside each node, an allreduce across nodes.

HSGD [Wang et al., IEICE 2020]; compare ChainerMN's ``two_dimensional_communicator.py``, which
does the node level with MPI messages. Here the node level sends no message at all:

1. Every local rank's two bucket buffers (:mod:`hpctrain.comm.buckets`: this round's input, where
   its gradients live, and the output) are its memory in one MPI-3 shared-memory window
   (:mod:`hpctrain.comm.window`). After a barrier, local rank j sums slice j of every local
   rank's input, times 1/world_size, into slice j of its own output (an intra-node
   reduce-scatter by loads and vectorised adds, the scale and the inf/NaN check folded in).
2. Local rank j allreduces its slice across nodes, with the ranks that have the same local
   index (``topology.inter``): the ring with the wire codec (fp16 travels only here; the
   window level is always full precision), or MPI's ``Iallreduce`` for a full-precision slice
   where that is faster (a size rule, or measured at construction: ``tune``, ``comm.tuner``).
3. Local rank j copies its finished slice into every other local rank's output; after a second
   barrier every rank's output holds the whole mean, and its ``p.grad`` views bind to it.

So on one node a rank reads the node's gradients once and writes the mean once (its slice into
every output) - no gather into the window, no copy out of it: the gradients already live there.

On uneven nodes (say 3 ranks, 2 per node) only the first ``min(node_sizes)`` local ranks own a
slice, so every slice has a partner on every node; the others only take part in the barriers.
On one node the window level is the whole reduction and the codec is unused (nothing travels).

What is non-blocking: the whole bucket is one generator (:mod:`hpctrain.comm.progress`) whose
barriers are ``Ibarrier`` on a per-bucket ``Dup`` of the node communicator. With overlap, the
hook that completes a bucket posts barrier 1; the first poll after every local rank has done so
runs the slice sum (local work, during backward) and posts the first ring messages; later polls
advance the ring and barrier 2. Nothing spins in a progress thread, which on oversubscribed
cores would steal time from backward.
"""
from __future__ import annotations

import torch
from mpi4py import MPI

from hpctrain.comm import tuner
from hpctrain.comm.base import GradSync
from hpctrain.comm.buckets import Bucket
from hpctrain.comm.fused import sum_into
from hpctrain.comm.progress import Reduction
from hpctrain.comm.ring import RingBuffers, allreduce_bucket, chunk_bounds
from hpctrain.comm.strategies import STRATEGIES
from hpctrain.comm.window import SharedWindow, aligned, layout
from hpctrain.comm.wire import Wire
from hpctrain.ops.budget import NULL_PROBE


def nodes_share_memory(topo) -> bool:
    """Do the ranks of every node share memory? Collective, the same answer on every rank."""
    shm = topo.intra.Split_type(MPI.COMM_TYPE_SHARED)
    shared = shm.Get_size() == topo.intra.Get_size()
    shm.Free()
    return bool(topo.comm.allreduce(shared, op=MPI.LAND))


@STRATEGIES.register("hierarchical")
class HierarchicalSync(GradSync):
    def _prepare(self, sizes) -> None:
        t = self.topo
        if not nodes_share_memory(t):
            raise ValueError("comm.strategy: hierarchical needs the ranks of a node to share memory; "
                             "comm.ranks_per_node must group ranks of one host")
        self._offsets, self._buf_bytes = layout(sizes)
        # Each local rank owns both buffers of every bucket; local rank 0 also one flag byte per
        # slice and bucket.
        self._win = SharedWindow(t.intra, 2 * self._buf_bytes, aligned(len(sizes) * t.local_size))
        self._n_slices = t.min_local_size if t.n_nodes > 1 else t.local_size

    def _alloc(self, n_elems: int, dtype, index: int, which: int, pinned: bool = False) -> torch.Tensor:
        # A staged (device) bucket's host side is this window memory too; instead of
        # ``pinned`` the window is registered with the CUDA driver (make_buckets).
        return self._view(self.topo.local_rank, index, which, n_elems, dtype)

    def _view(self, rank: int, index: int, which: int, n_elems: int, dtype) -> torch.Tensor:
        return self._win.view(rank, which * self._buf_bytes + self._offsets[index], n_elems, dtype)

    def _setup(self) -> None:
        t = self.topo
        self._intra = [t.intra.Dup() for _ in self.buckets]
        self._inter = [t.inter.Dup() for _ in self.buckets] if t.n_nodes > 1 else []
        self._segs, self._slice, self._rings, self._flags = [], [], [], []
        for b in self.buckets:
            dtype = b.bufs[0].dtype
            # segs[which][r]: local rank r's buffer ``which`` of this bucket
            self._segs.append([[self._view(r, b.index, which, b.n_elems, dtype) for r in range(t.local_size)]
                               for which in (0, 1)])
            self._flags.append(self._win.root_view(b.index * t.local_size, t.local_size, torch.uint8))
            sl, ring = self._slice_of(b.n_elems), None
            if sl is not None and t.n_nodes > 1:
                # measured (tune) across nodes on this slice of this rank's output, in place
                # and non-blocking as the reduction runs it; every rank of the inter
                # communicator has the same slice sizes, so they measure alike
                mine, wire = b.bufs[1][sl], b.wire.buf
                method = tuner.choose(self._inter[b.index], mine, mine, b.codec, 1.0, False,
                                      self.tune, self.measured)
                ring = RingBuffers(sl.stop - sl.start, dtype if wire is None else wire.dtype, t.n_nodes,
                                   b.codec, method)
            self._slice.append(sl)
            self._rings.append(ring)

    def _slice_of(self, n_elems: int) -> slice | None:
        """This local rank's slice of a bucket of ``n_elems`` (None: it owns none)."""
        t = self.topo
        if t.local_rank >= self._n_slices:
            return None
        lo, hi = chunk_bounds(n_elems, self._n_slices)[t.local_rank:t.local_rank + 2]
        return slice(lo, hi)

    def _wire(self, index: int, n_elems: int, dtype) -> Wire:
        """This rank's slice among the nodes (fp16 travels only there: the window level stays
        full precision; slice bounds are the same on every node, so is the codec); a rank
        without a slice, or one node, sends nothing."""
        sl = self._slice_of(n_elems)
        if sl is None or self.topo.n_nodes == 1:
            return Wire()
        return Wire.sized(self.codec, sl.stop - sl.start, dtype, self.topo.n_nodes, whole=False)

    def _barrier(self, intra: MPI.Comm, index: int):
        """Hand-over point: stores before it are visible to every local rank after it (waiting
        here is bucket ``index``'s ``wait`` in a budget)."""
        self._win.sync()
        budget = self.probe if self.probe is not NULL_PROBE else None   # no call per barrier otherwise
        if budget is not None:
            budget.tag(index, "wait")
        yield [intra.Ibarrier()]
        if budget is not None:
            budget.tag(index, None)
        self._win.sync()

    def reduce_bucket(self, bucket: Bucket) -> Reduction:
        i, t = bucket.index, self.topo
        if bucket.n_elems == 0:
            return False
        # Barrier 1: every local rank's gradients are in its input buffer.
        yield from self._barrier(self._intra[i], i)
        sl = self._slice[i]
        if sl is not None:
            ins, outs = self._segs[i][bucket.k], self._segs[i][1 - bucket.k]
            mine = outs[t.local_rank][sl]
            others = [o[sl] for r, o in enumerate(outs) if r != t.local_rank]
            srcs = [seg[sl] for seg in ins]
            ring = self._rings[i]
            found: bool | torch.Tensor      # host memory (the window): a host bool in practice
            if ring is None:
                with self.probe.span("reduce.node", i):
                    found = sum_into(srcs, mine, self.gather_scale, copies=others, check=True)
            else:               # level 2, across nodes: fp16 only here, the window stays fp32
                with self.probe.span("reduce.node", i):
                    sum_into(srcs, mine, self.gather_scale)
                wire = bucket.wire
                if wire.buf is not None:
                    with self.probe.span("pack", i):
                        wire.pack([mine])
                    found = yield from allreduce_bucket(ring, self._inter[i], wire.codec, wire.buf, wire.buf)
                    with self.probe.span("unpack", i):
                        wire.unpack([mine])
                else:
                    found = yield from allreduce_bucket(ring, self._inter[i], wire.codec, mine, mine)
                with self.probe.span("reduce.node", i):
                    for o in others:
                        o.copy_(mine)
            self._flags[i][t.local_rank] = int(found)
        # Barrier 2: every slice of every output and the flags are final; nobody reads an input
        # after this, so a rank may write its own buffers again (backward) once it is through.
        yield from self._barrier(self._intra[i], i)
        return bool(self._flags[i][:self._n_slices].any())

    def _methods(self) -> list[str]:
        if self.topo.n_nodes == 1:
            return ["shared-memory"] * len(self.buckets)
        return [f"shared-memory+{r.method}" if r else "shared-memory" for r in self._rings]

    def handles(self) -> list:
        return self._intra + self._inter + [self._win.win]

    def _free(self) -> None:
        for b in self.buckets:   # drop views of the window before unmapping it
            b.forget_buffers()
        self._segs, self._rings, self._flags = [], [], []
        self._win.free()
        for c in self._intra + self._inter:
            c.Free()
