"""Hierarchical strategy: a shared-memory level inside each node, an allreduce across nodes.

HSGD [Wang et al., IEICE 2020]; compare ChainerMN's ``two_dimensional_communicator.py``, which
does the node level with MPI messages. Here the node level sends no message at all:

1. Every local rank's bucket lives in its segment of one MPI-3 shared-memory window
   (:mod:`hpctrain.comm.window`). After a barrier, local rank j sums slice j of all local
   segments into a result area R (an intra-node reduce-scatter by loads and vectorised adds).
2. Local rank j allreduces its slice of R across nodes, with the ranks that have the same local
   index (``topology.inter``), using the ring and the wire codec (fp16 travels only here; the
   window level is always full precision).
3. After a second barrier every local rank reads the whole mean from R, in place.

Gradients enter the window already divided by the world size (``GradSync.gather_scale``), so the
node level is pure adds (one pass over a slice on two local ranks) and nothing scales later.

On uneven nodes (say 3 ranks, 2 per node) only the first ``min(node_sizes)`` local ranks own a
slice, so every slice has a partner on every node; the others only take part in the barriers.
On one node the window level is the whole reduction and the codec is unused (nothing travels).

What is non-blocking: the whole bucket is one generator (:mod:`hpctrain.comm.progress`) whose
barriers are ``Ibarrier`` on a per-bucket ``Dup`` of the node communicator. With overlap, the
hook that completes a bucket copies its gradients into the window and posts barrier 1; the
first poll after every local rank has done so runs the slice sum (local work, during backward)
and posts the first ring messages; later polls advance the ring and barrier 2. Nothing spins
in a progress thread, which on oversubscribed cores would steal time from backward.
"""
from __future__ import annotations

import torch
from mpi4py import MPI

from hpctrain.comm.base import Bucket, GradSync
from hpctrain.comm.compression import NoCompression
from hpctrain.comm.ring import SMALL_BYTES, RingBuffers, chunk_bounds, nonfinite, ring_allreduce
from hpctrain.comm.window import SharedWindow, aligned, layout

CHUNK_ELEMS = 1 << 18
"""Elements summed per step (1 MiB of fp32 out): with more than two local ranks the output chunk
stays in L2 across the adds; smaller chunks measured slower (Python dispatch per chunk)."""


def sum_into(srcs, out: torch.Tensor, scale: float = 1.0, chunk: int = CHUNK_ELEMS) -> None:
    """``out = scale * sum(srcs)``, element-wise, in fixed order, chunk by chunk."""
    for lo in range(0, out.numel(), chunk):
        hi = min(lo + chunk, out.numel())
        o = out[lo:hi]
        if len(srcs) == 1:
            o.copy_(srcs[0][lo:hi])
        else:
            torch.add(srcs[0][lo:hi], srcs[1][lo:hi], out=o)
            for s in srcs[2:]:
                o.add_(s[lo:hi])
        if scale != 1.0:
            o.mul_(scale)


class HierarchicalSync(GradSync):
    name = "hierarchical"

    def _prepare(self, sizes) -> None:
        t = self.topo
        shm = t.intra.Split_type(MPI.COMM_TYPE_SHARED)
        shared = shm.Get_size() == t.intra.Get_size()
        shm.Free()
        if not t.comm.allreduce(shared, op=MPI.LAND):     # same answer on every rank
            raise ValueError("comm.strategy: hierarchical needs the ranks of a node to share memory; "
                             "comm.ranks_per_node must group ranks of one host")
        self._offsets, seg_bytes = layout(sizes)
        # Local rank 0 also holds R (same layout as a segment) and one flag byte per slice.
        self._flag_offset = seg_bytes
        root_bytes = seg_bytes + aligned(len(sizes) * t.local_size)
        self._win = SharedWindow(t.intra, seg_bytes, root_bytes)
        self._n_slices = t.min_local_size if t.n_nodes > 1 else t.local_size

    def _alloc(self, n_elems: int, dtype, index: int) -> torch.Tensor:
        return self._win.view(self.topo.local_rank, self._offsets[index], n_elems, dtype)

    def _setup(self) -> None:
        t, w = self.topo, self._win
        self._intra = [t.intra.Dup() for _ in self.buckets]
        self._inter = [t.inter.Dup() for _ in self.buckets] if t.n_nodes > 1 else []
        self._segs, self._slice, self._rings, self._codecs, self._flags = [], [], [], [], []
        for b in self.buckets:
            off = self._offsets[b.index]
            # One rank on the node: its own segment is the node's sum, no copy into R.
            b.out = b.flat if t.local_size == 1 else w.root_view(off, b.n_elems, b.flat.dtype)
            self._segs.append([w.view(r, off, b.n_elems, b.flat.dtype) for r in range(t.local_size)])
            self._flags.append(w.root_view(self._flag_offset + b.index * t.local_size,
                                           t.local_size, torch.uint8))
            sl, ring, codec = None, None, None
            if t.local_rank < self._n_slices:
                lo, hi = chunk_bounds(b.n_elems, self._n_slices)[t.local_rank:t.local_rank + 2]
                sl = slice(lo, hi)
                if t.n_nodes > 1:   # slice bounds are the same on every node: so is this choice
                    big = (hi - lo) * b.flat.element_size() > SMALL_BYTES
                    codec = self.codec if self.codec.compresses and big else NoCompression()
                    wire = codec.wire_buffer(hi - lo) if codec.compresses else b.out[sl]
                    ring = RingBuffers(wire, t.n_nodes, codec)
            self._slice.append(sl)
            self._rings.append(ring)
            self._codecs.append(codec)

    def _barrier(self, intra: MPI.Comm):
        """Hand-over point: stores before it are visible to every local rank after it."""
        self._win.sync()
        yield [intra.Ibarrier()]
        self._win.sync()

    def reduce_bucket(self, bucket: Bucket):
        i, t = bucket.index, self.topo
        if bucket.n_elems == 0:
            return False
        # Barrier 1: every local rank's gradients are in its segment (gather_grads wrote them).
        yield from self._barrier(self._intra[i])
        sl = self._slice[i]
        if sl is not None:
            out = bucket.out[sl]
            if t.local_size > 1:
                sum_into([seg[sl] for seg in self._segs[i]], out)
            ring, codec = self._rings[i], self._codecs[i]
            if ring is None:
                found = nonfinite(out)
            else:                   # level 2, across nodes: fp16 only here, the window stays fp32
                if codec.compresses:
                    codec.pack([out], ring.wire)
                found = yield from ring_allreduce(ring, self._inter[i], codec)
                if codec.compresses:
                    codec.unpack(ring.wire, [out])
            self._flags[i][t.local_rank] = int(found)
        # Barrier 2: every slice of R and its flag are final; nobody reads a segment after this,
        # so a rank may overwrite its own segment (next round's gather) once it is through.
        # R is rewritten only after barrier 1 of the next round, which no rank reaches before
        # it has finished reading R (scatter) in this one.
        yield from self._barrier(self._intra[i])
        return bool(self._flags[i][:self._n_slices].any())

    def handles(self) -> list:
        return self._intra + self._inter + [self._win.win]

    def _free(self) -> None:
        for b in self.buckets:   # drop views of the window before unmapping it
            b.flat = b.out = torch.empty(0, dtype=b.flat.dtype)
        self._segs, self._rings, self._flags = [], [], []
        self._win.free()
        for c in self._intra + self._inter:
            c.Free()
