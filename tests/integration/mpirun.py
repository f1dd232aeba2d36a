"""Launch ``mpiexec -n N python …`` from a serial test, with the environment CI needs."""
import os
import subprocess
import sys
import time

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1"}


def mpirun(n: int, args: list[str], timeout: float = 300, env: dict | None = None):
    """Run and return (CompletedProcess, seconds)."""
    full_env = {**os.environ, **ENV, **(env or {})}
    t0 = time.perf_counter()
    r = subprocess.run(["mpiexec", "-n", str(n), sys.executable, *args], capture_output=True, text=True,
                       env=full_env, timeout=timeout)
    return r, time.perf_counter() - t0
