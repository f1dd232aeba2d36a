"""The emulated cluster for real: namespaces come and go, MPI spans them with the right node
grouping and the same answer as one host, and tc shapes the links. Needs root and network
namespaces; skipped (with the reason) where they cannot be created. Traffic goes only to the
namespaces' own addresses; every wait is bounded."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpctrain.tools.cluster import netns
from hpctrain.tools.cluster.spec import ClusterSpec, tbf_params
from hpctrain.ops.testhooks import CLUSTER_INJECT_FAULT
from tests.integration.mpirun import mpirun

_TAG = os.getpid() % 100000
WHY_NOT = netns.probe(f"hcp{_TAG}")
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"emulated cluster unavailable: {WHY_NOT}")

# Per test process, so two concurrent runs do not collide.
NAME, SUBNET = f"hct{_TAG}", f"10.77.{100 + _TAG % 150}.0/24"
RATE_BIT_S = 100e6


def cli(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpctrain", "cluster", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def leftovers(name: str) -> list[str]:
    nss = [n for n in os.listdir("/run/netns") if n.startswith(f"{name}-")] if os.path.isdir("/run/netns") else []
    return nss + [d for d in os.listdir("/sys/class/net") if d.startswith(f"{name}-")]


@pytest.fixture(scope="module")
def cluster():
    r = cli("up", "--nodes", "2", "--link", "100mbit", "--name", NAME, "--subnet", SUBNET)
    assert r.returncode == 0, r.stderr
    try:
        yield netns.load_spec(NAME)
    finally:
        cli("down", "--name", NAME)


def test_up_down_idempotent():
    name = f"hcu{_TAG}"
    spec = ClusterSpec(n_nodes=2, rate_bit_s=1e9, name=name, subnet=f"10.77.{10 + _TAG % 86}.0/24")
    r = cli("up", "--nodes", "2", "--link", "1gbit", "--name", name, "--subnet", spec.subnet)
    try:
        assert r.returncode == 0, r.stderr
        assert sorted(leftovers(name)) == sorted(spec.namespaces + [spec.bridge, spec.host_veth(0), spec.host_veth(1)])
        addr = subprocess.run(["ip", "-n", spec.namespace(1), "-4", "-o", "addr", "show", "eth0"],
                              capture_output=True, text=True, check=True).stdout
        assert f"{spec.address(1)}/24" in addr
        for side in (["tc"], ["ip", "netns", "exec", spec.namespace(0), "tc"]):
            dev = spec.host_veth(0) if len(side) == 1 else "eth0"
            q = subprocess.run(side + ["qdisc", "show", "dev", dev], capture_output=True, text=True).stdout
            assert "tbf" in q and "rate 1Gbit" in q, q
        again = cli("up", "--name", name, "--subnet", spec.subnet)
        assert again.returncode == 2 and "already up" in again.stderr
        clash = cli("up", "--name", f"hco{_TAG}", "--subnet", spec.subnet)
        assert clash.returncode == 2 and f"already used by {spec.bridge}" in clash.stderr
        assert leftovers(f"hco{_TAG}") == []
    finally:
        down = cli("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert leftovers(name) == [] and not netns.state_dir(name).exists()
    assert "nothing to remove" in cli("down", "--name", name).stdout


def test_failed_up_leaves_nothing():
    name = f"hcf{_TAG}"
    r = cli("up", "--nodes", "3", "--name", name, "--subnet", "10.77.98.0/24",
            env={CLUSTER_INJECT_FAULT: "fail:1"})
    assert r.returncode == 2 and "injected fault after node 1" in r.stderr
    assert leftovers(name) == []


def test_interrupted_up_leaves_nothing():
    name = f"hci{_TAG}"
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain", "cluster", "up", "--nodes", "2", "--name",
                             name, "--subnet", "10.77.97.0/24"], env={**os.environ, CLUSTER_INJECT_FAULT: "hang:0"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not Path("/run/netns", f"{name}-node0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        cli("down", "--name", name)
    assert proc.returncode == 2 and "interrupted by signal" in err, err
    assert leftovers(name) == []


def test_latency_refused_or_applied_clearly():
    """netem is optional: where the kernel lacks it, ``--latency-ms`` fails saying so."""
    name = f"hcl{_TAG}"
    r = cli("up", "--nodes", "1", "--latency-ms", "1", "--name", name, "--subnet", "10.77.96.0/24")
    cli("down", "--name", name)
    if netns.probe_qdisc(["netem", "delay", "1ms"], name=f"hcq{_TAG}") is None:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode == 2 and "netem" in r.stderr


ALLREDUCE = r"""
import json, socket, sys
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
node = comm.Split_type(MPI.COMM_TYPE_SHARED)
x = np.random.default_rng(comm.rank).integers(-1000, 1000, 2**18).astype(np.float64)   # 2 MiB, exact sums
y = np.empty_like(x)
comm.Allreduce(x, y)
comm.Allreduce(MPI.IN_PLACE, x)     # twice: a lazily set-up path must agree too
info = comm.gather({"rank": comm.rank, "host": socket.gethostname(), "node_ranks": node.allgather(comm.rank)})
if comm.rank == 0:
    np.save(sys.argv[1], y)
    print(json.dumps({"info": info, "same_twice": bool(np.array_equal(x, y))}))
"""


def _expected_sum(n_ranks: int) -> np.ndarray:
    return sum(np.random.default_rng(r).integers(-1000, 1000, 2**18).astype(np.float64) for r in range(n_ranks))


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs Open MPI's mpiexec")
def test_allreduce_across_two_nodes_matches_one_host(cluster, tmp_path):
    before = netns.link_counters(cluster)
    r = cli("mpiexec", "--name", NAME, "-n", "4", "--timeout", "60", "--",
            sys.executable, "-c", ALLREDUCE, str(tmp_path / "cluster.npy"), timeout=90)
    assert r.returncode == 0, r.stderr
    after = netns.link_counters(cluster)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    hosts = {d["rank"]: d["host"] for d in out["info"]}
    groups = {d["rank"]: d["node_ranks"] for d in out["info"]}
    assert hosts == {0: cluster.namespace(0), 1: cluster.namespace(0), 2: cluster.namespace(1), 3: cluster.namespace(1)}
    assert groups == {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}     # COMM_TYPE_SHARED = a namespace
    assert out["same_twice"]
    on_cluster = np.load(tmp_path / "cluster.npy")
    np.testing.assert_array_equal(on_cluster, _expected_sum(4))
    one = mpirun(4, ["-c", ALLREDUCE, str(tmp_path / "one.npy")], timeout=90)[0]
    assert one.returncode == 0, one.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "one.npy"), on_cluster)
    # the inter-node half of the traffic crossed the emulated links (at least one 2 MiB buffer)
    for node in (0, 1):
        assert after[node][0] - before[node][0] >= 2**21
        assert after[node][1] - before[node][1] >= 2**21


RECEIVER = r"""
import socket, sys, time
host, n = sys.argv[1], int(sys.argv[2])
srv = socket.create_server((host, 5599)); srv.settimeout(20)
print("ready", flush=True)
conn, _ = srv.accept(); conn.settimeout(20)
got, t0 = 0, None
while got < n:
    b = conn.recv(1 << 20)
    if not b:
        break
    t0 = t0 or time.perf_counter()
    got += len(b)
print(got, time.perf_counter() - t0, flush=True)
"""
SENDER = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], 5599), timeout=20)
c.sendall(b"x" * int(sys.argv[2]))
c.close()
"""


def test_tc_shapes_the_link(cluster):
    """5 MB at 100 Mbit/s: at least (5 MB - one bucket) / 12.5 MB/s ≈ 0.39 s, however fast the host."""
    n_bytes = 5_000_000
    dst = cluster.address(1)
    recv = subprocess.Popen(["ip", "netns", "exec", cluster.namespace(1), sys.executable, "-c", RECEIVER,
                             dst, str(n_bytes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready", recv.stderr.read()
        subprocess.run(["ip", "netns", "exec", cluster.namespace(0), sys.executable, "-c", SENDER, dst,
                        str(n_bytes)], check=True, timeout=30)
        out, err = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
    got, secs = out.split()
    burst, _ = tbf_params(RATE_BIT_S)
    floor_s = (n_bytes - burst) * 8 / RATE_BIT_S
    assert int(got) == n_bytes
    assert floor_s <= float(secs) < 10 * floor_s, (secs, floor_s)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="needs Open MPI's mpiexec")
def test_bench_on_a_temporary_cluster(tmp_path):
    """``cluster bench`` runs hpctrain's allreduce benchmark across real (emulated) nodes, the
    strategies see 2 ranks per node through COMM_TYPE_SHARED, and the cluster is gone after."""
    name = f"hcb{_TAG}"
    out = tmp_path / "bench.json"
    r = cli("bench", "--nodes", "2", "--ranks-per-node", "2", "--link", "1gbit", "--sizes", "256K",
            "--iters", "1", "--warmup", "0", "--name", name, "--subnet", "10.77.95.0/24",
            "--json", str(out), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert leftovers(name) == []
    d = json.loads(out.read_text())
    got = {(row["impl"], row["compression"]): row for row in d["rows"]}
    assert set(got) >= {("flat", "none"), ("flat", "fp16"), ("hierarchical", "none"), ("hierarchical", "fp16")}
    assert all(row["ranks_per_node"] == 2 and row["world_size"] == 4 for row in got.values())
    assert len(d["comparison"]) == 4 and "hierarchical vs flat, fp32" in r.stdout
