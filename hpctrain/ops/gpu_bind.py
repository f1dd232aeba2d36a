"""Which GPU a rank uses, decided from the launcher before MPI is initialised.

A CUDA-aware MPI may create a CUDA context on the current device when it initialises (and
torch's default device is GPU 0), so every rank of a node would hold a context on GPU 0 unless
the device is chosen first. The launchers say each rank's place on its *real* node in the
environment before any MPI call: :func:`launcher_local_rank`. Emulated nodes
(``comm.ranks_per_node``) are a layout of the communicators only; the GPU a rank binds is always
chosen by its rank on the physical host. Importing this module loads neither MPI nor CUDA.
"""
from __future__ import annotations

import os

LOCAL_RANK_VARS = (
    "OMPI_COMM_WORLD_LOCAL_RANK",   # Open MPI's mpiexec
    "MPI_LOCALRANKID",              # MPICH's Hydra
    "MV2_COMM_WORLD_LOCAL_RANK",    # MVAPICH2
    "PALS_LOCAL_RANKID",            # Cray PALS
    "FLUX_TASK_LOCAL_ID",           # Flux
    "SLURM_LOCALID",                # srun; last: mpiexec inside a batch step inherits the step's
)


def launcher_local_rank(environ=os.environ) -> int | None:
    """This rank's index on its physical node as the launcher set it, or None where no known
    launcher variable is set (the MPI shared-memory split decides then)."""
    for name in LOCAL_RANK_VARS:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def device_index(local_rank: int, n_visible: int) -> int:
    """``local rank mod visible GPUs`` (after ``jobs/common/bind.sh`` one GPU is visible: 0)."""
    return local_rank % n_visible


def early_bind(want: str | None, environ=os.environ) -> int | None:
    """Before MPI is initialised: make ``cuda:<launcher local rank mod visible GPUs>`` current
    where ``want`` is ``auto``/``cuda``, torch sees CUDA and the launcher says the local rank.
    Returns the index bound, or None (nothing done)."""
    if want not in ("auto", "cuda"):
        return None
    local = launcher_local_rank(environ)
    if local is None:
        return None
    import torch
    if not torch.cuda.is_available():
        return None
    index = device_index(local, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return index
