"""Flat strategy: one allreduce per fusion bucket over the whole communicator.

Every rank is a peer; a bandwidth-optimal ring (:mod:`hpctrain.comm.ring`) with the chosen wire
codec, MPI's ``Iallreduce`` for small full-precision buckets. Use it on one node or where the
network is uniform. Compare ChainerMN's ``flat_communicator.py``.
"""
from hpctrain.comm.base import Bucket, GradSync
from hpctrain.comm.compression import NoCompression
from hpctrain.comm.ring import SMALL_BYTES, RingBuffers, ring_allreduce


class FlatSync(GradSync):
    name = "flat"

    def _setup(self) -> None:
        # One communicator per bucket: rings of different buckets may be in flight together.
        self._comms = [self.comm.Dup() for _ in self.buckets]
        n = self.comm.Get_size()
        self._codecs, self._rings = [], []
        for b in self.buckets:
            big = b.n_elems * b.flat.element_size() > SMALL_BYTES
            codec = self.codec if self.codec.compresses and big and n > 1 else NoCompression()
            if codec.compresses:
                b.wire, b.codec = codec.wire_buffer(b.n_elems), codec
            self._codecs.append(codec)
            self._rings.append(RingBuffers(b.flat if b.wire is None else b.wire, n, codec))

    def reduce_bucket(self, bucket: Bucket):
        i = bucket.index
        found = yield from ring_allreduce(self._rings[i], self._comms[i], self._codecs[i])
        bucket.encoded = bucket.wire is not None     # decoded into p.grad by scatter, or on read
        return found

    def handles(self) -> list:
        return list(self._comms)

    def _free(self) -> None:
        for c in self._comms:
            c.Free()
