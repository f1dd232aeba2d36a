"""Launch MPI jobs across the emulated nodes, and single commands inside one node.

Open MPI starts one ``orted`` per host of its hostfile through the ``plm_rsh_agent`` (normally
ssh); ours (``spec.agent_script``) enters the node's network namespace instead. Each orted then
is a node to Open MPI: ranks under the same orted share memory (the ``vader`` BTL, and
``COMM_TYPE_SHARED`` groups them), ranks under different orteds talk TCP over the shaped veth
links (``btl_tcp_if_include`` is the cluster's subnet, so nothing bypasses the links). mpiexec
itself stays in the root namespace and is reached by the orteds at the bridge address.
Open MPI 4.1 MCA parameters: ``ompi_info --all``; rsh launcher: orte/mca/plm/rsh.
"""
from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpctrain.tools.cluster.spec import ClusterSpec, hostfile_text

__all__ = ["mpiexec_argv", "run_mpiexec", "exec_argv", "MPI_ENV"]

# Open MPI as root, oversubscribed on a small machine (docs/environment.md).
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def mpiexec_argv(spec: ClusterSpec, state: Path, command: list[str], n_ranks: int,
                 ranks_per_node: int, extra: Sequence[str] = (), mpiexec: str = "mpiexec",
                 n_cores: int | None = None) -> list[str]:
    """The full ``mpiexec`` command line placing ``ranks_per_node`` consecutive ranks per node.

    The emulated nodes share this machine's ``n_cores`` (default: all): with more ranks than cores
    the ranks yield when idle instead of busy-polling, which Open MPI does by itself when it sees
    oversubscription on one host but cannot see across the emulated hosts' slots.
    """
    if ranks_per_node < 1:
        raise ValueError(f"--ranks-per-node {ranks_per_node}: must be ≥ 1")
    if not 1 <= n_ranks <= spec.n_nodes * ranks_per_node:
        raise ValueError(f"-n {n_ranks}: between 1 and nodes × ranks per node = "
                         f"{spec.n_nodes * ranks_per_node}")
    if not command:
        raise ValueError("no command to run (put it after --)")
    hostfile = state / f"hostfile-{ranks_per_node}"
    subnet = str(spec.network)
    mca = {"plm_rsh_agent": str(state / "agent.sh"),
           "plm_rsh_no_tree_spawn": "1",          # every orted from mpiexec, none from a node
           "oob_tcp_if_include": subnet,          # orted ↔ mpiexec over the bridge
           "btl_tcp_if_include": subnet,          # rank ↔ rank over the shaped links
           "btl": "self,vader,tcp",
           "pml": "ob1"}                          # the BTLs above, not a UCX transport of its own
    if n_ranks > (n_cores or os.cpu_count() or 1):
        mca["mpi_yield_when_idle"] = "1"
    argv = [mpiexec, "--hostfile", str(hostfile), "-n", str(n_ranks), "--map-by", "slot",
            "--bind-to", "none"]
    for k, v in mca.items():
        argv += ["--mca", k, v]
    return argv + list(extra) + list(command)


def write_hostfile(spec: ClusterSpec, state: Path, ranks_per_node: int) -> Path:
    path = state / f"hostfile-{ranks_per_node}"
    path.write_text(hostfile_text(spec, ranks_per_node))
    return path


def run_mpiexec(argv: list[str], timeout_s: float | None = None) -> int:
    """Run mpiexec in the foreground; SIGINT/SIGTERM go to it (it ends the ranks on every node)
    and, past ``timeout_s``, it is terminated. Returns its exit code."""
    env = {**os.environ, **MPI_ENV}
    proc = subprocess.Popen(argv, env=env)

    def forward(signum, _frame):
        proc.send_signal(signum)
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return 124
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def exec_argv(spec: ClusterSpec, node: int, command: list[str]) -> list[str]:
    """Run ``command`` inside node ``node``'s network namespace (e.g. a socket test, iperf)."""
    if not 0 <= node < spec.n_nodes:
        raise ValueError(f"node {node}: the cluster has nodes 0..{spec.n_nodes - 1}")
    if not command:
        raise ValueError("no command to run (put it after --)")
    return ["ip", "netns", "exec", spec.namespace(node), *command]
