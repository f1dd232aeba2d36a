"""Horovod's API on hpctrain: ``import hpctrain.horovod.torch as hvd`` in place of
``import horovod.torch as hvd`` runs a Horovod script on hpctrain's topology and gradient sync,
with no C++ build and no ``horovodrun`` (launch with ``mpiexec``, ``srun`` or ``jobs/``).
See :mod:`hpctrain.horovod.torch` and docs/horovod.md."""
