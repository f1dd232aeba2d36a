"""Flat strategy: one allreduce per fusion bucket over the whole communicator.

Every rank is a peer; a bandwidth-optimal ring (:mod:`hpctrain.comm.ring`) with the chosen wire
codec, MPI's ``Iallreduce`` for small full-precision buckets. Use it on one node or where the
network is uniform. Compare ChainerMN's ``flat_communicator.py``.
"""
from hpctrain.comm.base import Bucket, GradSync
from hpctrain.comm.ring import RingBuffers, ring_allreduce


class FlatSync(GradSync):
    name = "flat"

    def _setup(self) -> None:
        # One communicator per bucket: rings of different buckets may be in flight together.
        self._comms = [self.comm.Dup() for _ in self.buckets]
        n = self.comm.Get_size()
        self._rings = [RingBuffers(b.flat, n, self.codec) for b in self.buckets]

    def reduce_bucket(self, bucket: Bucket):
        scale = 1.0 if self.prescale else self.scale    # buckets are usually pre-divided
        return (yield from ring_allreduce(self._rings[bucket.index], self._comms[bucket.index],
                                          self.codec, scale))

    def handles(self) -> list:
        return list(self._comms)

    def _free(self) -> None:
        for c in self._comms:
            c.Free()
