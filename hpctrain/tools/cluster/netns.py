"""Build, inspect and remove an emulated cluster (runs the commands of ``spec.py``; needs root).

Safe to interrupt: ``bring_up`` records the names it is about to create in a state file *before*
creating anything, turns SIGTERM/SIGHUP into an exception while it works, and removes whatever it
made if anything goes wrong. ``tear_down`` is idempotent: it removes the devices and namespaces of
the state file and any left over with the cluster's prefix (say a ``kill -9`` during ``up``),
after ending the processes still running inside them (ranks of an aborted job).
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from hpctrain.ops.testhooks import CLUSTER_INJECT_FAULT, cluster_fault
from hpctrain.tools.cluster.spec import ClusterSpec, agent_script, bridge_commands, node_commands

__all__ = ["ClusterError", "state_dir", "load_spec", "require_root", "check_tools", "probe",
           "probe_qdisc", "bring_up", "tear_down", "link_counters", "node_processes"]

# Tool → the Debian package that has it.
TOOLS = {"ip": "iproute2", "tc": "iproute2", "unshare": "util-linux", "sysctl": "procps"}


class ClusterError(RuntimeError):
    """A cluster operation that cannot proceed; the message says why and what to do."""


def state_dir(name: str) -> Path:
    """Where cluster ``name`` keeps its state file and launch agent: ``$HPCTRAIN_CLUSTER_STATE``,
    else /run/hpctrain-cluster (gone at reboot, like the namespaces), else /tmp."""
    base = os.environ.get("HPCTRAIN_CLUSTER_STATE")
    if not base:
        base = "/run/hpctrain-cluster" if os.access("/run", os.W_OK) else "/tmp/hpctrain-cluster"
    return Path(base) / name


def load_spec(name: str) -> ClusterSpec | None:
    """The spec of cluster ``name`` from its state file, or None when it is not (being) up."""
    path = state_dir(name) / "state.json"
    if not path.exists():
        return None
    return ClusterSpec.from_dict(json.loads(path.read_text())["spec"])


def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterError("needs root to create network namespaces, veth pairs and tc qdiscs "
                           "(run as root, or with sudo)")


def check_tools() -> None:
    missing = sorted({f"{t} (Debian package {p})" for t, p in TOOLS.items() if shutil.which(t) is None})
    if missing:
        raise ClusterError("missing tools: " + ", ".join(missing))


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {(r.stderr or r.stdout).strip()}")
    return r


def _exists_ns(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


def _exists_link(dev: str) -> bool:
    return Path("/sys/class/net", dev).exists()


def probe(name: str = "hpcprobe") -> str | None:
    """None when this process can create network namespaces and veth pairs, else the reason."""
    try:
        require_root()
        check_tools()
    except ClusterError as exc:
        return str(exc)
    ns = f"{name}-node0"
    try:
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", f"{name}-v0", "type", "veth", "peer", "name", "eth0", "netns", ns])
        return None
    except ClusterError as exc:
        return f"cannot create network namespaces or veth pairs here: {exc}"
    finally:
        _run(["ip", "netns", "del", ns], check=False)
        _run(["ip", "link", "del", f"{name}-v0"], check=False)


def probe_qdisc(qdisc: list[str], name: str = "hpcprobe") -> str | None:
    """None when ``tc qdisc add … root <qdisc>`` works on a veth here, else tc's error (e.g.
    ``netem`` needs the sch_netem kernel module, which some kernels lack)."""
    dev = f"{name}-q0"
    try:
        _run(["ip", "link", "add", dev, "type", "veth", "peer", "name", f"{name}-q1"])
        r = _run(["tc", "qdisc", "add", "dev", dev, "root", *qdisc], check=False)
        return None if r.returncode == 0 else (r.stderr or r.stdout).strip() or f"exit {r.returncode}"
    except ClusterError as exc:
        return str(exc)
    finally:
        _run(["ip", "link", "del", dev], check=False)


class _Interrupted(ClusterError):
    """A signal arrived while the cluster was being built (it has been removed again)."""


def _interrupted(signum: int) -> Exception:
    return _Interrupted(f"interrupted by signal {signum}")


@contextmanager
def signals_raise(make_exc=_interrupted):
    """Turn SIGTERM/SIGHUP (as well as SIGINT) into ``make_exc(signum)`` while the block runs, so
    the caller's clean-up runs; restore the previous handlers afterwards."""
    def handler(signum, _frame):
        raise make_exc(signum)
    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _inject_fault(node: int) -> None:
    """The test hook after node ``node`` is built (:func:`hpctrain.ops.testhooks.cluster_fault`)."""
    kind = cluster_fault(node)
    if kind == "fail":
        raise ClusterError(f"injected fault after node {node} ({CLUSTER_INJECT_FAULT})")
    if kind == "hang":
        time.sleep(60)


def bring_up(spec: ClusterSpec) -> Path:
    """Create the cluster (bridge, one namespace per node, shaped links) and its launch agent;
    returns the state directory. Raises ClusterError (having removed anything half-made)."""
    require_root()
    check_tools()
    if any(_leftovers(spec.name)):
        raise ClusterError(f"cluster {spec.name!r} is already up "
                           f"(`python -m hpctrain cluster down --name {spec.name}` first)")
    clash = _subnet_users(spec)
    if clash:
        raise ClusterError(f"subnet {spec.subnet} is already used by {', '.join(clash)} "
                           "(choose another with --subnet, e.g. 10.77.1.0/24)")
    if spec.latency_ms > 0:
        why = probe_qdisc(["netem", "delay", "1ms"], name=f"{spec.name}p")
        if why:
            raise ClusterError(f"--latency-ms needs tc's netem qdisc, which this kernel lacks ({why}); "
                               "bandwidth shaping (tbf) works without it: drop --latency-ms")
    sdir = state_dir(spec.name)
    sdir.mkdir(parents=True, exist_ok=True)
    _write_state(sdir, spec, "creating")
    try:
        with signals_raise():
            for cmd in bridge_commands(spec):
                _run(cmd)
            for i in range(spec.n_nodes):
                for cmd in node_commands(spec, i):
                    _run(cmd)
                _inject_fault(i)
            agent = sdir / "agent.sh"
            agent.write_text(agent_script(spec))
            agent.chmod(0o755)
            _write_state(sdir, spec, "up")
    except BaseException:
        tear_down(spec.name)
        raise
    return sdir


def _subnet_users(spec: ClusterSpec) -> list[str]:
    """Root-namespace devices with an IPv4 address inside the cluster's subnet (another cluster's
    bridge, say): a second bridge on the same subnet would break routing for both."""
    r = _run(["ip", "-4", "-o", "addr", "show"])
    users = []
    for line in r.stdout.splitlines():      # "3: dev    inet 10.77.0.254/24 brd ... scope global dev"
        parts = line.split()
        if len(parts) > 3 and parts[2] == "inet":
            iface = ipaddress.ip_interface(parts[3])
            if iface.network.overlaps(spec.network):
                users.append(f"{parts[1]} ({parts[3]})")
    return users


def _write_state(sdir: Path, spec: ClusterSpec, status: str) -> None:
    tmp = sdir / "state.json.tmp"
    tmp.write_text(json.dumps({"spec": spec.to_dict(), "status": status, "pid": os.getpid(),
                               "time": time.time()}, indent=1))
    tmp.replace(sdir / "state.json")


def _leftovers(name: str) -> tuple[list[str], list[str]]:
    """Namespaces and root-namespace devices named like cluster ``name``'s, whatever the state
    file says."""
    ns_re = re.compile(rf"^{re.escape(name)}-node\d+$")
    dev_re = re.compile(rf"^{re.escape(name)}-(v\d+|br)$")
    nss = sorted(n for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
                 if ns_re.match(n))
    devs = sorted(d for d in os.listdir("/sys/class/net") if dev_re.match(d))
    return nss, devs


def node_processes(ns: str) -> list[int]:
    """PIDs of the processes running in namespace ``ns``."""
    r = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def _end_processes(nss: list[str], grace_s: float = 2.0) -> None:
    """SIGTERM the processes left inside our namespaces (an aborted job's ranks), then SIGKILL."""
    pids = [p for ns in nss for p in node_processes(ns)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
            time.sleep(0.05)
        pids = [p for p in pids if Path(f"/proc/{p}").exists()]
        if not pids:
            return


def tear_down(name: str) -> list[str]:
    """Remove cluster ``name`` (idempotent); returns what was removed."""
    require_root()
    spec = load_spec(name)
    nss, devs = _leftovers(name)
    if spec is not None:
        nss = sorted(set(nss) | {n for n in spec.namespaces if _exists_ns(n)})
    _end_processes(nss)
    removed = []
    for ns in nss:
        if _run(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(ns)
    for dev in devs:    # a namespace's veth goes with it; a leftover (or the bridge) goes here
        if _exists_link(dev) and _run(["ip", "link", "del", dev], check=False).returncode == 0:
            removed.append(dev)
    shutil.rmtree(state_dir(name), ignore_errors=True)
    still_ns, still_devs = _leftovers(name)
    if still_ns or still_devs:
        raise ClusterError(f"could not remove {', '.join(still_ns + still_devs)}")
    return removed


def link_counters(spec: ClusterSpec) -> dict[int, tuple[int, int]]:
    """Bytes through each node's link so far, {node: (sent_by_node, received_by_node)}, read on
    the switch side (a frame the node sends is one the switch port receives)."""
    out = {}
    for i in range(spec.n_nodes):
        stats = Path("/sys/class/net", spec.host_veth(i), "statistics")
        out[i] = (int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text()))
    return out
