"""Flat strategy: one allreduce per fusion bucket over the whole communicator.

Every rank is a peer. Per bucket: MPI's allreduce for latency-bound buckets and where MPI's
tuned algorithms are faster, else the bandwidth-optimal ring (:mod:`hpctrain.comm.ring`) with
the chosen wire codec (:func:`hpctrain.comm.compression.wire_codec`). Which one is a fixed size
rule (``tune="static"``, :func:`hpctrain.comm.ring.mpi_choice`) or measured per bucket when the
strategy is built (``tune="measure"``, a training job's default: :mod:`hpctrain.comm.tuner`).
In a round that only :meth:`~hpctrain.comm.base.GradSync.finish` starts (no overlap, no
``begin()``: SSGD's step), MPI's buckets take its faster blocking ``Allreduce``; every rank
starts the same buckets in the same order there, so blocking cannot deadlock
(``ring.allreduce_bucket``). All of them out of place: the mean lands in ``bucket.out`` and the
gradients in ``bucket.flat`` stay. Use it on one node without shared memory between ranks, or
where the network is uniform. Compare ChainerMN's ``flat_communicator.py``.
"""
from hpctrain.comm import tuner
from hpctrain.comm.base import GradSync
from hpctrain.comm.buckets import Bucket
from hpctrain.comm.progress import Reduction
from hpctrain.comm.ring import RingBuffers, allreduce_bucket
from hpctrain.comm.strategies import STRATEGIES


@STRATEGIES.register("flat")
class FlatSync(GradSync):
    def _setup(self) -> None:
        # One communicator per bucket: rings of different buckets may be in flight together.
        self._comms = [self.comm.Dup() for _ in self.buckets]
        n = self.comm.Get_size()
        self._rings = []
        for b, comm in zip(self.buckets, self._comms):    # b.codec: its wire's (GradSync._wire)
            dtype = b.bufs[0].dtype if b.packed is None else b.packed.dtype
            # measured on the bucket's own buffers (overwritten by the first round anyway), as
            # a training step will call it: blocking unless overlapped
            method = tuner.choose(comm, b.bufs[0], b.bufs[1], b.codec, self.gather_scale,
                                  not self.overlap, self.tune, self.measured)
            self._rings.append(RingBuffers(b.n_elems, dtype, n, b.codec, method, b.bufs[0].device))

    def reduce_bucket(self, bucket: Bucket) -> Reduction:
        i = bucket.index
        if bucket.packed is not None:       # packed and pre-divided by gather_grads; in place
            return (yield from allreduce_bucket(self._rings[i], self._comms[i], bucket.codec,
                                                bucket.packed, bucket.packed))
        return (yield from allreduce_bucket(self._rings[i], self._comms[i], bucket.codec,
                                            bucket.flat, bucket.out, self.gather_scale,
                                            blocking=self.blocking_round))

    def _methods(self) -> list[str]:
        return [ring.method if b.codec.name == "none" else f"{ring.method}/{b.codec.name}"
                for ring, b in zip(self._rings, self.buckets)]

    def handles(self) -> list:
        return list(self._comms)

    def _free(self) -> None:
        for c in self._comms:
            c.Free()
