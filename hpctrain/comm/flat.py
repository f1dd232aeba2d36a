"""Flat strategy: one in-place MPI ``Allreduce`` per fusion bucket over the whole communicator.

The MPI library picks the algorithm (ring, recursive doubling…); use it on one node or where the
network is uniform. Compare ChainerMN's ``flat_communicator.py``.
"""
from mpi4py import MPI

from hpctrain.comm.base import Bucket, GradSync, as_numpy


class FlatSync(GradSync):
    name = "flat"

    def reduce_bucket(self, bucket: Bucket) -> None:
        self.comm.Allreduce(MPI.IN_PLACE, as_numpy(bucket.flat), op=MPI.SUM)
