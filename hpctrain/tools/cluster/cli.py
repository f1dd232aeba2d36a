"""``python -m hpctrain cluster {up,down,status,mpiexec,run,exec}``: an emulated multi-node cluster.

    python -m hpctrain cluster up --nodes 2 --link 1gbit
    python -m hpctrain cluster mpiexec -n 4 -- python -m hpctrain bench allreduce --sizes 64MB
    python -m hpctrain cluster exec 1 -- ip addr
    python -m hpctrain cluster down
    python -m hpctrain cluster bench --nodes 2 --ranks-per-node 2 --link 1gbit --sizes 64M
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from hpctrain.tools.cluster import launch, netns
from hpctrain.tools.cluster.compare import compare, format_comparison
from hpctrain.tools.cluster.spec import ClusterSpec, format_rate, parse_rate_bit_s


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m hpctrain cluster",
                                 description="Emulate a cluster on this machine: one Linux network "
                                             "namespace per node, veth links to a bridge shaped by "
                                             "tc, Open MPI launched across the nodes. Needs root.")
    sub = ap.add_subparsers(dest="action", required=True)
    name = argparse.ArgumentParser(add_help=False)
    name.add_argument("--name", default="hpc", help="cluster name: prefix of its namespaces and "
                                                    "devices (default hpc)")
    up = sub.add_parser("up", parents=[name], help="create the nodes and links")
    up.add_argument("--nodes", type=int, default=2, help="number of nodes (default 2)")
    up.add_argument("--link", default="1gbit", help="per-node link rate each way, tc units: 100mbit, "
                                                    "1gbit, 10gbit, or none (default 1gbit)")
    up.add_argument("--latency-ms", type=float, default=0.0,
                    help="added one-way node-to-node latency (needs the kernel's netem qdisc)")
    up.add_argument("--subnet", default="10.77.0.0/24", help="node addresses (default 10.77.0.0/24)")
    b = sub.add_parser("bench", help="up a temporary cluster, run `bench allreduce` across it "
                                     "(flat/hierarchical × fp32/fp16), compare, down")
    b.add_argument("--nodes", type=int, default=2)
    b.add_argument("--ranks-per-node", type=int, default=2)
    b.add_argument("--link", default="1gbit", help="per-node link rate (default 1gbit)")
    b.add_argument("--sizes", default="64M", help="fp32 payload sizes (default 64M)")
    b.add_argument("--iters", type=int, default=5)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--timeout", type=float, default=900, help="end the job after this many s")
    b.add_argument("--name", default="hpcbench", help="the temporary cluster's name")
    b.add_argument("--subnet", default="10.77.250.0/24")
    b.add_argument("--json", metavar="FILE", help="write the rows and the comparison")
    sub.add_parser("down", parents=[name], help="remove the cluster (idempotent)")
    st = sub.add_parser("status", parents=[name], help="nodes, addresses, links and bytes sent")
    st.add_argument("--json", action="store_true", help="print JSON")
    for action in ("mpiexec", "run"):
        mp = sub.add_parser(action, parents=[name], help="launch an MPI job across the nodes"
                                                          + (" (same as mpiexec)" if action == "run" else ""))
        mp.add_argument("-n", type=int, default=0, help="ranks (default nodes × ranks per node)")
        mp.add_argument("--ranks-per-node", type=int, default=0,
                        help="consecutive ranks on each node (default ceil(n / nodes), or 1)")
        mp.add_argument("--timeout", type=float, default=None, help="end the job after this many s")
        mp.add_argument("--mpi-arg", action="append", default=[], metavar="ARG",
                        help="extra mpiexec argument (repeatable), e.g. --mpi-arg=--report-bindings")
        mp.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    ex = sub.add_parser("exec", parents=[name], help="run a command inside one node's namespace")
    ex.add_argument("node", type=int)
    ex.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    return ap


def _command(rest: list[str]) -> list[str]:
    return rest[1:] if rest[:1] == ["--"] else rest


def _spec_up(name: str) -> ClusterSpec:
    spec = netns.load_spec(name)
    if spec is None:
        raise netns.ClusterError(f"cluster {name!r} is not up (`python -m hpctrain cluster up` first)")
    return spec


def _ranks(spec: ClusterSpec, n: int, per_node: int) -> tuple[int, int]:
    """(ranks, ranks per node) from what the user gave."""
    if per_node <= 0:
        per_node = max(1, math.ceil(n / spec.n_nodes)) if n > 0 else 1
    return (n if n > 0 else spec.n_nodes * per_node), per_node


def _status(spec: ClusterSpec) -> dict:
    counters = netns.link_counters(spec)
    return {"spec": spec.to_dict(), "link": format_rate(spec.rate_bit_s),
            "nodes": [{"node": i, "namespace": spec.namespace(i), "address": spec.address(i),
                       "sent_bytes": counters[i][0], "received_bytes": counters[i][1]}
                      for i in range(spec.n_nodes)]}


def _print_status(s: dict) -> None:
    sp = s["spec"]
    lat = f", +{sp['latency_ms']:g} ms one-way" if sp["latency_ms"] else ""
    print(f"cluster {sp['name']!r}: {sp['n_nodes']} node(s) on {sp['subnet']}, links {s['link']} each way{lat}")
    print(f"{'node':>4}  {'namespace':<14} {'address':<15} {'sent MB':>10} {'received MB':>12}")
    for n in s["nodes"]:
        print(f"{n['node']:>4}  {n['namespace']:<14} {n['address']:<15} "
              f"{n['sent_bytes'] / 1e6:>10.1f} {n['received_bytes'] / 1e6:>12.1f}")


def _bench(args) -> int:
    spec = ClusterSpec(n_nodes=args.nodes, rate_bit_s=parse_rate_bit_s(args.link), name=args.name,
                       subnet=args.subnet)
    k = args.ranks_per_node
    with netns.signals_raise(lambda signum: KeyboardInterrupt()):   # tear-down in finally
        state = netns.bring_up(spec)
        try:
            rows_file = state / "rows.json"
            bench = [sys.executable, "-m", "hpctrain", "bench", "allreduce", "--sizes", args.sizes,
                     "--iters", str(args.iters), "--warmup", str(args.warmup), "--no-gloo",
                     "--strategies", "flat,hierarchical", "--compressions", "none,fp16",
                     "--json", str(rows_file)]
            argv = launch.mpiexec_argv(spec, state, bench, spec.n_nodes * k, k)
            launch.write_hostfile(spec, state, k)
            print(f"emulated cluster: {spec.n_nodes} nodes × {k} ranks, links "
                  f"{format_rate(spec.rate_bit_s)} each way", flush=True)
            rc = launch.run_mpiexec(argv, args.timeout)
            if rc != 0:
                return rc
            rows = json.loads(rows_file.read_text())
        finally:
            netns.tear_down(spec.name)
    results = compare(rows, spec.n_nodes, spec.rate_bit_s)
    print(format_comparison(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cluster": spec.to_dict(), "ranks_per_node": k, "rows": rows,
                       "comparison": results}, f, indent=1)
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "up":
            spec = ClusterSpec(n_nodes=args.nodes, rate_bit_s=parse_rate_bit_s(args.link),
                               latency_ms=args.latency_ms, name=args.name, subnet=args.subnet)
            sdir = netns.bring_up(spec)
            _print_status(_status(spec))
            print(f"state in {sdir}; `python -m hpctrain cluster down --name {spec.name}` removes it")
        elif args.action == "bench":
            return _bench(args)
        elif args.action == "down":
            removed = netns.tear_down(args.name)
            print(f"cluster {args.name!r}: " + (f"removed {', '.join(removed)}" if removed else "nothing to remove"))
        elif args.action == "status":
            s = _status(_spec_up(args.name))
            print(json.dumps(s, indent=1)) if args.json else _print_status(s)
        elif args.action in ("mpiexec", "run"):
            spec = _spec_up(args.name)
            n, per_node = _ranks(spec, args.n, args.ranks_per_node)
            state = netns.state_dir(spec.name)
            argv_ = launch.mpiexec_argv(spec, state, _command(args.command), n, per_node, args.mpi_arg)
            launch.write_hostfile(spec, state, per_node)
            return launch.run_mpiexec(argv_, args.timeout)
        elif args.action == "exec":
            spec = _spec_up(args.name)
            argv_ = launch.exec_argv(spec, args.node, _command(args.command))
            os.execvp(argv_[0], argv_)
    except (netns.ClusterError, ValueError) as exc:
        print(f"hpctrain cluster: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hpctrain cluster: interrupted", file=sys.stderr)
        return 130
    return 0
