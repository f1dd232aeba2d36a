"""Launch ``mpiexec -n N python …`` from a serial test, with the environment CI needs.

The launcher follows the MPI that this Python's mpi4py is bound to: ``HPCTRAIN_MPIEXEC`` if set
(``make test-mpich`` sets ``mpiexec.mpich``), else ``mpiexec.mpich`` for the MPICH venv
(``.venv-mpich``) and ``mpiexec`` (Debian's default, Open MPI) otherwise. The ``OMPI_*`` variables
are what Open MPI needs as root on 2 cores; MPICH's Hydra ignores them (it runs as root and
oversubscribes without being asked).
"""
import os
import subprocess
import sys
import time

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1"}
MPIEXEC = os.environ.get("HPCTRAIN_MPIEXEC") or (
    "mpiexec.mpich" if os.path.basename(sys.prefix).endswith("-mpich") else "mpiexec")
IMPL = "mpich" if "mpich" in os.path.basename(MPIEXEC) or "hydra" in os.path.basename(MPIEXEC) else "openmpi"


def mpirun(n: int, args: list[str], timeout: float = 300, env: dict | None = None):
    """Run and return (CompletedProcess, seconds)."""
    full_env = {**os.environ, **ENV, **(env or {})}
    t0 = time.perf_counter()
    r = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], capture_output=True, text=True,
                       env=full_env, timeout=timeout)
    return r, time.perf_counter() - t0
