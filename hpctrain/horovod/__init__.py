"""Horovod's API on hpctrain: ``import hpctrain.horovod.torch as hvd`` in place of
``import horovod.torch as hvd`` runs a Horovod script on hpctrain's topology and gradient sync,
with no C++ build and no ``horovodrun`` (launch with ``mpiexec``, ``srun`` or ``jobs/``).
See :mod:`hpctrain.horovod.torch` and docs/horovod.md.

The modules here touch no framework, as Horovod's own ``horovod/common``: the agreement before
every collective (:mod:`.coordinator`), the job's state and process sets (:mod:`.process_sets`),
async handles (:mod:`.handles`), the timeline (:mod:`.timeline`) and Horovod's exceptions
(:mod:`.errors`). :mod:`hpctrain.horovod.torch` is the PyTorch API on them."""
from __future__ import annotations

from typing import NoReturn


def run(func, *args, **kwargs) -> NoReturn:
    """``horovod.run(func, np=..., hosts=...)`` starts its own processes; hpctrain jobs are
    started by the MPI launcher instead (scripts that only reach ``horovod.run`` behind an option,
    like Horovod's MNIST example, run unchanged with ``import hpctrain.horovod as horovod``)."""
    from hpctrain.horovod.errors import unsupported
    raise unsupported("horovod.run", "launch the script itself: mpiexec -n N python script.py "
                      "(or srun, or the batch scripts in jobs/ with --script)")
