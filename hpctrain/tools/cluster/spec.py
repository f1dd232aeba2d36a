"""What an emulated cluster is made of, as pure data: names, addresses, link shaping and the exact
``ip``/``tc`` commands that build and remove it. Nothing here runs a command (see ``netns.py``).

Layout (one machine, one kernel):

    root namespace:  bridge <name>-br (10.77.0.254/24) ── veth <name>-v0 … <name>-v{N-1}
    namespace <name>-node{i}:  eth0 (10.77.0.{i+1}/24) ── the peer of <name>-v{i}, plus lo

Each node is a network namespace; its ``eth0`` is one end of a veth pair whose other end is a
bridge port, like a NIC cabled to a switch. Bandwidth is shaped on *both* egress sides of every
veth (node→switch on ``eth0``, switch→node on ``<name>-v{i}``), so each node has a full-duplex
link of the given rate, as a real Ethernet port does. Shaping uses ``tbf`` [tc-tbf(8)]; latency
uses ``netem`` [tc-netem(8)], half of the one-way latency on each side, when the kernel has it.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = ["ClusterSpec", "parse_rate_bit_s", "format_rate", "tbf_params", "up_commands",
           "shape_commands", "bridge_commands", "node_commands", "hostfile_text", "agent_script", "MAX_NODES"]

MAX_NODES = 64
_UNITS = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")   # device names are at most 15 characters


def parse_rate_bit_s(text: str) -> float:
    """``'1gbit'`` → 1e9; the units of tc(8) (bit, kbit, mbit, gbit, decimal); ``'0'``/``'none'``
    means unshaped and returns 0."""
    t = text.strip().lower()
    if t in ("0", "none", "off", "unlimited"):
        return 0.0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?bit)?(?:/s|ps)?", t)
    if not m:
        raise ValueError(f"--link {text!r}: expected a rate like 100mbit, 1gbit, 10gbit (or none)")
    rate = float(m.group(1)) * _UNITS[m.group(2) or ""]
    if rate <= 0:
        raise ValueError(f"--link {text!r}: the rate must be positive (or none)")
    return rate


def format_rate(rate_bit_s: float) -> str:
    """1e9 → ``'1gbit'`` (tc's spelling, integral where possible); 0 → ``'unshaped'``."""
    if rate_bit_s <= 0:
        return "unshaped"
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        scaled = rate_bit_s / _UNITS[unit]
        if scaled >= 1:
            return f"{scaled:g}{unit}"
    return f"{rate_bit_s:g}bit"


def tbf_params(rate_bit_s: float) -> tuple[int, int]:
    """(burst_bytes, limit_bytes) for ``tbf`` at ``rate_bit_s``.

    The bucket holds 1 ms of traffic but at least 64 KiB, so that a full-size GSO/TSO segment of a
    veth (up to 64 KiB) passes in one piece instead of being split by the qdisc; the queue holds
    20 ms of traffic (at least 4 buckets) so TCP sees a switch-sized buffer, not drops.
    """
    rate_B_s = rate_bit_s / 8
    burst = max(64 * 1024, int(rate_B_s * 1e-3))
    limit = max(4 * burst, int(rate_B_s * 20e-3))
    return burst, limit


@dataclass(frozen=True)
class ClusterSpec:
    n_nodes: int = 2
    rate_bit_s: float = 1e9          # per link and direction; 0 = unshaped
    latency_ms: float = 0.0          # one-way, node to node; needs netem
    name: str = "hpc"                # prefix of every namespace and device
    subnet: str = "10.77.0.0/24"

    def __post_init__(self):
        if not 1 <= self.n_nodes <= MAX_NODES:
            raise ValueError(f"--nodes {self.n_nodes}: between 1 and {MAX_NODES}")
        if not _NAME_RE.match(self.name):
            raise ValueError(f"--name {self.name!r}: 1-8 lower-case letters/digits, starting with a letter")
        if self.latency_ms < 0:
            raise ValueError(f"--latency-ms {self.latency_ms}: must be ≥ 0")
        if self.rate_bit_s < 0:
            raise ValueError("the link rate must be ≥ 0")
        net = self.network
        if net.version != 4 or net.prefixlen > 24 or not net.is_private:
            raise ValueError(f"--subnet {self.subnet}: a private IPv4 /24 (or larger), e.g. 10.77.0.0/24")

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:    # validate(): IPv4
        return ipaddress.ip_network(self.subnet, strict=True)

    @property
    def bridge(self) -> str:
        return f"{self.name}-br"

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the switch: where ``mpiexec`` itself is reached."""
        return str(self.network.network_address + 254)

    def namespace(self, node: int) -> str:
        return f"{self.name}-node{node}"

    def host_veth(self, node: int) -> str:
        """The switch-side end of node ``node``'s cable (in the root namespace)."""
        return f"{self.name}-v{node}"

    def address(self, node: int) -> str:
        return str(self.network.network_address + node + 1)

    @property
    def namespaces(self) -> list[str]:
        return [self.namespace(i) for i in range(self.n_nodes)]

    @property
    def addresses(self) -> list[str]:
        return [self.address(i) for i in range(self.n_nodes)]

    def to_dict(self) -> dict:
        return {"n_nodes": self.n_nodes, "rate_bit_s": self.rate_bit_s, "latency_ms": self.latency_ms,
                "name": self.name, "subnet": self.subnet}

    @classmethod
    def from_dict(cls, d: dict) -> ClusterSpec:
        return cls(**{k: d[k] for k in ("n_nodes", "rate_bit_s", "latency_ms", "name", "subnet")})


NODE_IF = "eth0"   # the node's NIC inside its namespace


def shape_commands(spec: ClusterSpec, node: int) -> list[list[str]]:
    """``tc`` commands shaping both directions of node ``node``'s link (none when unshaped)."""
    if spec.rate_bit_s <= 0 and spec.latency_ms <= 0:
        return []
    ns = spec.namespace(node)
    sides = [["tc", "qdisc", "replace", "dev", spec.host_veth(node), "root"],
             ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", NODE_IF, "root"]]
    if spec.latency_ms > 0:
        delay_ms = spec.latency_ms / 2   # half on the way out of the node, half on the way in
        qdisc = ["netem", "delay", f"{delay_ms:g}ms", "limit", "100000"]
        if spec.rate_bit_s > 0:
            qdisc += ["rate", f"{int(spec.rate_bit_s)}bit"]
    else:
        burst, limit = tbf_params(spec.rate_bit_s)
        qdisc = ["tbf", "rate", f"{int(spec.rate_bit_s)}bit", "burst", str(burst), "limit", str(limit)]
    return [side + qdisc for side in sides]


def bridge_commands(spec: ClusterSpec) -> list[list[str]]:
    """The switch: a bridge in the root namespace with the address mpiexec is reached at.
    IPv6 is off on every device: only our IPv4 addresses talk."""
    br = spec.bridge
    return [["ip", "link", "add", br, "type", "bridge"],
            ["sysctl", "-qw", f"net.ipv6.conf.{br}.disable_ipv6=1"],
            ["ip", "addr", "add", f"{spec.bridge_address}/{spec.network.prefixlen}", "dev", br],
            ["ip", "link", "set", br, "up"]]


def node_commands(spec: ClusterSpec, node: int) -> list[list[str]]:
    """One node: its namespace, its cable to the switch, its address and its link shaping."""
    ns, veth = spec.namespace(node), spec.host_veth(node)
    inside = ["ip", "-n", ns]
    return [["ip", "netns", "add", ns],
            ["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"],
            ["ip", "link", "add", veth, "type", "veth", "peer", "name", NODE_IF, "netns", ns],
            ["sysctl", "-qw", f"net.ipv6.conf.{veth}.disable_ipv6=1"],
            ["ip", "link", "set", veth, "master", spec.bridge, "up"],
            inside + ["addr", "add", f"{spec.address(node)}/{spec.network.prefixlen}", "dev", NODE_IF],
            inside + ["link", "set", NODE_IF, "up"],
            inside + ["link", "set", "lo", "up"]] + shape_commands(spec, node)


def up_commands(spec: ClusterSpec) -> list[list[str]]:
    """Every command that builds the cluster, in order."""
    return bridge_commands(spec) + [c for i in range(spec.n_nodes) for c in node_commands(spec, i)]


def hostfile_text(spec: ClusterSpec, slots: int) -> str:
    """An Open MPI hostfile: one line per node address with ``slots`` ranks."""
    return "".join(f"{a} slots={slots}\n" for a in spec.addresses)


def agent_script(spec: ClusterSpec) -> str:
    """An Open MPI ``plm_rsh_agent``: where mpiexec would run ``ssh HOST CMD`` it runs this.

    It enters HOST's network namespace and a UTS namespace of its own named after the node, so
    each node has its own hostname (and Open MPI's session directory), then runs CMD with
    ``sh -c`` exactly as sshd would. It exports ``HPCTRAIN_NODE_ADDR`` (the node's address) and
    ``GLOO_SOCKET_IFNAME`` (its NIC), which the ranks inherit from their orted.
    """
    cases = "".join(f"  {a}) ns={ns} ;;\n" for a, ns in zip(spec.addresses, spec.namespaces))
    return ("#!/bin/sh\n"
            f"# Open MPI launch agent of the emulated cluster {spec.name!r} (written by\n"
            "# `python -m hpctrain cluster up`): ssh HOST CMD -> run CMD inside HOST's namespace.\n"
            'host=$1; shift\n'
            'case "$host" in\n'
            f"{cases}"
            '  *) echo "hpctrain cluster agent: no node has address $host" >&2; exit 255 ;;\n'
            "esac\n"
            "# The node's address for programs that open their own sockets (a torch.distributed\n"
            "# rendezvous on rank 0's node), and the NIC gloo should use.\n"
            'export HPCTRAIN_NODE_ADDR="$host" GLOO_SOCKET_IFNAME=' + NODE_IF + "\n"
            'exec ip netns exec "$ns" unshare --uts sh -c \'hostname "$0" && exec sh -c "$1"\' "$ns" "$*"\n')
