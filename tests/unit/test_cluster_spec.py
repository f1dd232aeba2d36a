"""The emulated cluster's layout, shaping parameters, launch agent and mpiexec line (no root)."""
import os
import stat
import subprocess

import pytest

from hpctrain.tools.cluster import launch
from hpctrain.tools.cluster.cli import _ranks
from hpctrain.tools.cluster.spec import (ClusterSpec, agent_script, format_rate, hostfile_text,
                                   parse_rate_bit_s, shape_commands, tbf_params, up_commands)


@pytest.mark.parametrize("text,bits", [("1gbit", 1e9), ("100mbit", 1e8), ("2.5gbit", 2.5e9),
                                       ("10Gbit", 1e10), ("64kbit", 64e3), ("1000", 1e3),
                                       ("none", 0.0), ("0", 0.0)])
def test_parse_rate(text, bits):
    assert parse_rate_bit_s(text) == bits


@pytest.mark.parametrize("text", ["fast", "1gb", "-1gbit", "1 gigabit", ""])
def test_parse_rate_rejects(text):
    with pytest.raises(ValueError, match="--link"):
        parse_rate_bit_s(text)


def test_format_rate_round_trips():
    for text in ("1gbit", "100mbit", "2.5gbit", "64kbit"):
        assert format_rate(parse_rate_bit_s(text)) == text
    assert format_rate(0) == "unshaped"


def test_tbf_params_hold_a_gso_segment_and_a_millisecond():
    burst, limit = tbf_params(100e6)           # 1 ms at 100 Mbit/s is 12.5 kB < 64 KiB
    assert burst == 65536 and limit == max(4 * 65536, int(12.5e6 * 0.02))
    burst, limit = tbf_params(10e9)            # 1 ms at 10 Gbit/s is 1.25 MB
    assert burst == 1_250_000 and limit == 25_000_000


def test_addresses_names_and_bridge():
    s = ClusterSpec(n_nodes=3, name="abc", subnet="10.77.5.0/24")
    assert s.addresses == ["10.77.5.1", "10.77.5.2", "10.77.5.3"]
    assert s.namespaces == ["abc-node0", "abc-node1", "abc-node2"]
    assert s.bridge == "abc-br" and s.bridge_address == "10.77.5.254"
    assert max(len(d) for d in [s.bridge, s.host_veth(63)]) <= 15      # IFNAMSIZ - 1
    assert ClusterSpec.from_dict(s.to_dict()) == s


@pytest.mark.parametrize("kwargs,match", [({"n_nodes": 0}, "--nodes"), ({"n_nodes": 65}, "--nodes"),
                                          ({"name": "Bad-Name"}, "--name"), ({"name": "waytoolong"}, "--name"),
                                          ({"subnet": "8.8.8.0/24"}, "--subnet"),
                                          ({"subnet": "10.77.0.0/28"}, "--subnet"),
                                          ({"latency_ms": -1}, "--latency-ms")])
def test_spec_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClusterSpec(**kwargs)


def test_up_commands_build_each_node_and_shape_both_directions():
    s = ClusterSpec(n_nodes=2, rate_bit_s=1e9, name="t")
    cmds = [" ".join(c) for c in up_commands(s)]
    assert cmds[0] == "ip link add t-br type bridge"
    assert "ip addr add 10.77.0.254/24 dev t-br" in cmds
    for i in range(2):
        assert f"ip netns add t-node{i}" in cmds
        assert f"ip link add t-v{i} type veth peer name eth0 netns t-node{i}" in cmds
        assert f"ip -n t-node{i} addr add 10.77.0.{i + 1}/24 dev eth0" in cmds
        shaped = [c for c in cmds if "tbf rate 1000000000bit" in c and (f"t-v{i} " in c or f"t-node{i} " in c)]
        assert len(shaped) == 2, shaped       # switch→node and node→switch
    # the namespace exists before anything is put into it
    assert cmds.index("ip netns add t-node1") < cmds.index("ip link add t-v1 type veth peer name eth0 netns t-node1")


def test_shaping_choices():
    assert shape_commands(ClusterSpec(rate_bit_s=0), 0) == []
    lat = shape_commands(ClusterSpec(rate_bit_s=1e9, latency_ms=2), 1)
    assert all(c[c.index("root") + 1:][:3] == ["netem", "delay", "1ms"] for c in lat)   # half each way
    assert all("rate" in c for c in lat)


def test_hostfile():
    assert hostfile_text(ClusterSpec(n_nodes=2), 3) == "10.77.0.1 slots=3\n10.77.0.2 slots=3\n"


def test_agent_enters_the_namespace_of_the_host(tmp_path):
    """Run the generated agent with a stand-in ``ip`` that prints what it was asked to do."""
    s = ClusterSpec(n_nodes=2, name="t", subnet="10.77.3.0/24")
    agent = tmp_path / "agent.sh"
    agent.write_text(agent_script(s))
    agent.chmod(agent.stat().st_mode | stat.S_IEXEC)
    fake_ip = tmp_path / "ip"
    fake_ip.write_text('#!/bin/sh\nprintf "<%s>" "$HPCTRAIN_NODE_ADDR"\nfor a in "$@"; do printf "[%s]" "$a"; done\n')
    fake_ip.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    r = subprocess.run([str(agent), "10.77.3.2", "orted", "-mca", "x", '"a;b"'], capture_output=True,
                       text=True, env=env, timeout=10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("<10.77.3.2>[netns][exec][t-node1][unshare][--uts][sh][-c]")
    assert r.stdout.endswith('[t-node1][orted -mca x "a;b"]')       # one string, as ssh passes it
    bad = subprocess.run([str(agent), "10.77.3.9", "true"], capture_output=True, text=True, env=env, timeout=10)
    assert bad.returncode == 255 and "no node has address 10.77.3.9" in bad.stderr


def test_mpiexec_argv(tmp_path):
    s = ClusterSpec(n_nodes=2, subnet="10.77.4.0/24")
    argv = launch.mpiexec_argv(s, tmp_path, ["python", "x.py"], 4, 2, ["--tag-output"], n_cores=8)
    assert argv[:5] == ["mpiexec", "--hostfile", str(tmp_path / "hostfile-2"), "-n", "4"]
    pairs = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
    assert pairs["plm_rsh_agent"] == str(tmp_path / "agent.sh")
    assert pairs["btl_tcp_if_include"] == pairs["oob_tcp_if_include"] == "10.77.4.0/24"
    assert argv[-3:] == ["--tag-output", "python", "x.py"]
    assert "mpi_yield_when_idle" not in pairs
    over = launch.mpiexec_argv(s, tmp_path, ["x"], 4, 2, n_cores=2)      # 4 ranks on 2 cores
    assert over[over.index("mpi_yield_when_idle") + 1] == "1"
    with pytest.raises(ValueError, match="-n 5"):
        launch.mpiexec_argv(s, tmp_path, ["x"], 5, 2)
    with pytest.raises(ValueError, match="no command"):
        launch.mpiexec_argv(s, tmp_path, [], 2, 1)


def test_rank_defaults():
    s = ClusterSpec(n_nodes=2)
    assert _ranks(s, 4, 0) == (4, 2)       # -n 4 on 2 nodes: 2 per node
    assert _ranks(s, 3, 0) == (3, 2)
    assert _ranks(s, 0, 0) == (2, 1)
    assert _ranks(s, 0, 3) == (6, 3)
