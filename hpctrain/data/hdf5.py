"""Which HDF5 file driver reads the shards: parallel (``driver='mpio'``) or serial per-shard files.

With parallel HDF5 (h5py built against an MPI HDF5, ``h5py.get_config().mpi``) every rank of the
reading communicator opens each shard file *collectively* once, and then reads its own runs with
independent MPI-IO reads (``H5FD_MPIO_INDEPENDENT``, h5py's default): one metadata operation per
file for the whole job instead of one per rank, which is what parallel file systems (Lustre, GPFS)
reward. The reads happen in the loader's background thread, so MPI must provide
``MPI_THREAD_MULTIPLE``; otherwise, and when h5py has no MPI, each rank opens the files itself
(``sec2`` driver), which is always correct.
"""
from __future__ import annotations

import h5py

from hpctrain.errors import UserError

DRIVERS = ("auto", "mpio", "serial")


class DriverError(UserError, ValueError):
    """The requested driver cannot be used here (message says why and what to install)."""


def mpio_status(comm) -> tuple[bool, str]:
    """``(usable, reason)`` for parallel HDF5 over ``comm`` (``None``: no communicator given)."""
    if comm is None:
        return False, "no communicator given"
    if not h5py.get_config().mpi:
        return False, ("h5py built without MPI (rebuild with HDF5_MPI=ON against an MPI HDF5, "
                       "see scripts/setup.sh)")
    from mpi4py import MPI
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return False, "MPI provides less than MPI_THREAD_MULTIPLE (the reader runs in a thread)"
    return True, "h5py built with MPI"


def choose_driver(requested: str, comm) -> tuple[str, str]:
    """Resolve ``auto|mpio|serial`` to ``(driver, reason)``; ``mpio`` that cannot work raises."""
    if requested not in DRIVERS:
        raise DriverError(f"HDF5 driver {requested!r}: expected one of {', '.join(DRIVERS)}")
    if requested == "serial":
        return "serial", "requested"
    ok, why = mpio_status(comm)
    if ok:
        return "mpio", why
    if requested == "mpio":
        raise DriverError(f"HDF5 driver 'mpio' unavailable: {why}")
    return "serial", why


def open_read(path: str, driver: str, comm) -> h5py.File:
    """Open a shard for reading; with ``mpio`` this is collective over ``comm``."""
    if driver == "mpio":
        return h5py.File(path, "r", driver="mpio", comm=comm)
    return h5py.File(path, "r")
