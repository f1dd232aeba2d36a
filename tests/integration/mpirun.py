"""Launch ``mpiexec -n N python …`` from a serial test, with the environment CI needs.

The launcher follows the MPI that this Python's mpi4py is bound to: ``HPCTRAIN_MPIEXEC`` if set
(``make test-mpich`` sets ``mpiexec.mpich``), else ``mpiexec.mpich`` for the MPICH venv
(``.venv-mpich``) and ``mpiexec`` (Debian's default, Open MPI) otherwise. The ``OMPI_*`` variables
are what Open MPI needs as root on 2 cores; MPICH's Hydra ignores them (it runs as root and
oversubscribes without being asked).
"""
import os
import re
import subprocess
import sys
import time

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_NUM_THREADS": "1"}
MPIEXEC = os.environ.get("HPCTRAIN_MPIEXEC") or (
    "mpiexec.mpich" if os.path.basename(sys.prefix).endswith("-mpich") else "mpiexec")
IMPL = "mpich" if "mpich" in os.path.basename(MPIEXEC) or "hydra" in os.path.basename(MPIEXEC) else "openmpi"


# A launcher's banner opens with a rule of dashes. Open MPI forwards a rank's stderr through its
# event loop and prints its own banner directly, so a rank's last line can still be waiting for its
# newline when the rule is written: "hpctrain: error: ...-------". Seen once, in test_ops_rundir.py.
_BANNER_RULE = re.compile(r"(?<=[^\n-])(-{20,})")


def hpctrain_lines(stderr: str, prefix: str = "hpctrain") -> list[str]:
    """The lines a job printed that start with ``prefix``, a launcher banner's rule split off."""
    return [line for line in _BANNER_RULE.sub(r"\n\1", stderr).splitlines() if line.startswith(prefix)]


def mpirun(n: int, args: list[str], timeout: float = 300, env: dict | None = None):
    """Run and return (CompletedProcess, seconds)."""
    full_env = {**os.environ, **ENV, **(env or {})}
    t0 = time.perf_counter()
    r = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], capture_output=True, text=True,
                       env=full_env, timeout=timeout)
    return r, time.perf_counter() - t0


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from each process's PPid in /proc: children of any thread)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parent[int(entry)] = int(fh.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def rank_pids(launcher_pid: int) -> list[int]:
    """The ranks' Python processes below the launcher: its children under Open MPI, its
    grandchildren under MPICH's Hydra (mpiexec → hydra_pmi_proxy → ranks)."""
    ranks = []
    for p in _descendants(launcher_pid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and os.path.realpath(argv[0]) == os.path.realpath(sys.executable):
            ranks.append(p)
    return ranks


def start_training(run_dir, n: int, *extra, timeout: float = 180) -> subprocess.Popen:
    """``mpiexec -n N python -m hpctrain`` in the background, returned once its first epoch is
    logged (so signals and kills land mid-training)."""
    import pytest
    proc = subprocess.Popen([MPIEXEC, "-n", str(n), sys.executable, "-m", "hpctrain", "--no-progress",
                             "--run-dir", str(run_dir), *extra], env={**os.environ, **ENV},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = os.path.join(str(run_dir), "metrics.jsonl"), time.monotonic() + timeout
    while not (os.path.exists(metrics) and '"epoch"' in open(metrics).read()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(proc.communicate()[1][-3000:])
        time.sleep(0.2)
    return proc
