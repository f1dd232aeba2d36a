"""Which thread calls MPI: ``comm.overlap`` on a GPU needs ``MPI_THREAD_MULTIPLE``.

With ``comm.overlap`` the post-accumulate-grad hooks start and progress buckets, calling MPI
(``Isend``/``Irecv``/``Iallreduce``, ``Test``). On the CPU autograd runs them on the thread that
called ``backward()``; on CUDA it runs them on its own device thread, so MPI is called from a
thread that is not the main one while the main thread may call MPI too (``finish()``). MPI
allows that only at ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it; a library built without thread
support gives less, silently). A lower level is refused at start-up with one line naming it.
"""
from __future__ import annotations

import torch
from mpi4py import MPI

LEVEL_NAMES = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
               MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED", MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}


def overlap_unsupported(overlap: bool, device, provided: int | None = None) -> str | None:
    """Why ``comm.overlap`` cannot run on ``device`` with this MPI (None: it can): on CUDA the
    hooks call MPI from autograd's device thread, which needs ``MPI_THREAD_MULTIPLE``.
    ``provided``: the level MPI gives (default ``MPI.Query_thread()``)."""
    if not overlap or torch.device(device).type != "cuda":
        return None
    level = MPI.Query_thread() if provided is None else provided
    if level >= MPI.THREAD_MULTIPLE:
        return None
    return (f"comm.overlap=true on {torch.device(device)} calls MPI from autograd's device thread, which needs "
            f"MPI_THREAD_MULTIPLE, but this MPI provides {LEVEL_NAMES.get(level, level)}: set comm.overlap=false "
            "or use an MPI library built with thread support")
