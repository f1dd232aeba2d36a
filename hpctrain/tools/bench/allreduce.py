"""Allreduce benchmark: hpctrain's strategies against mpi4py's ``Allreduce`` and torch gloo.

    mpiexec -n 2 .venv/bin/python -m hpctrain bench allreduce [--sizes 4K,64M] [--iters 10]
            [--ranks-per-node K] [--json FILE]

For each fp32 payload size: mpi4py ``Allreduce`` in place on a NumPy buffer (the baseline;
``+mean`` adds the division by the world size and the inf/NaN check every strategy does),
hpctrain ``flat`` and ``hierarchical`` with compression ``none`` and ``fp16`` (``comm.tune =
measure``, as a job runs them), and
``torch.distributed`` gloo (the peer). Scope ``whole``: the strategy's ``allreduce_grads()`` as
a training step calls it (``p.grad`` already the bucket's view). Scope ``floor`` (one node,
several ranks): the memory traffic of the node-level sum alone, no synchronisation, the bound
``hierarchical`` cannot beat on one host. Scope ``collective``: the data is already in the
bucket, put there by the strategy's own gather (the copy every strategy needs, pre-dividing;
for ``hierarchical`` into the shared window; for fp16 a pack into the half-precision buffer,
which replaces that copy), and the mean is left where the strategy leaves it (in place; fp16
leaves it encoded for the unpack into the gradients that replaces the copy back). Each timed
iteration is preceded by an untimed refill of the input and a barrier; an iteration's time is
the slowest rank's; the table shows the median. The implementations take turns iteration by
iteration, so background load hits all of them alike.
algbw = bytes / time and busbw = algbw * 2(n-1)/n (nccl-tests' definitions, PERFORMANCE.md
there), where bytes is the fp32 payload, also for fp16 (its effective bandwidth).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.comm.fused import scale_and_check
from hpctrain.comm.progress import run
from hpctrain.tools.bench.report import run_mpi_bench
from hpctrain.topology import Topology

DEFAULT_SIZES = "4K,64K,1M,4M,16M,64M,256M"
UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "M": 2**20, "MB": 2**20, "G": 2**30, "GB": 2**30}


def parse_size(text: str) -> int:
    """'64M' -> 67108864 bytes (binary units; a multiple of 4, the fp32 element)."""
    t = text.strip().upper()
    digits = t.rstrip("KMGB")
    n_bytes = int(float(digits) * UNITS[t[len(digits):]])
    if n_bytes <= 0 or n_bytes % 4:
        raise argparse.ArgumentTypeError(f"size {text!r} must be a positive multiple of 4 bytes")
    return n_bytes


def bandwidths(n_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes), nccl-tests' definitions."""
    algbw = n_bytes / time_s / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def timed_round_robin(comm: MPI.Comm, cases, iters: int, warmup: int) -> list[float]:
    """Median over iterations of the slowest rank's time of each case's ``op()`` (seconds).

    ``cases`` are ``(op, refill)`` pairs. Every iteration runs every case once, in an order that
    rotates, so that each implementation sees the same background load (a shared machine's
    noise then spreads over all of them instead of biasing whichever ran during a busy spell).
    """
    times: list[list[float]] = [[] for _ in cases]
    for i in range(warmup + iters):
        for k in range(len(cases)):
            j = (k + i) % len(cases)
            op, refill = cases[j]
            refill()
            comm.Barrier()
            t0 = time.perf_counter()
            op()
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if i >= warmup:
                times[j].append(dt)
    return [float(np.median(t)) for t in times]


def case_mpi4py(comm, src):
    buf = src.numpy().copy()
    return (lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
            lambda: np.copyto(buf, src.numpy())), None


def case_mpi4py_mean(comm, src):
    """MPI's Allreduce plus what any framework adds to it: the mean (a ``mul_``) and the inf/NaN
    check. The floor of a strategy that hands a bucket to MPI."""
    buf, scale = src.clone(), 1.0 / comm.Get_size()

    def op():
        comm.Allreduce(MPI.IN_PLACE, buf.numpy(), op=MPI.SUM)
        scale_and_check(buf, scale)
    return (op, lambda: buf.copy_(src)), None


def case_memory_floor(topo, src):
    """The memory traffic a node-level reduction cannot avoid, with no synchronisation: this
    rank's 1/local_size slice of every local rank's input read (here: local copies), summed
    into its output, and copied into the other local ranks' outputs. None off a single node."""
    n, k = topo.local_size, src.numel() // max(topo.local_size, 1)
    if topo.n_nodes != 1 or n < 2:
        return None
    ins = [src[:k].clone() for _ in range(n)]
    outs = [torch.empty(k) for _ in range(n)]

    def op():
        torch.add(ins[0], ins[1], out=outs[0])
        for t in ins[2:]:
            outs[0].add_(t)
        for o in outs[1:]:
            o.copy_(outs[0])
    return (op, lambda: None), None


def case_whole(name, codec, topo, src):
    """``allreduce_grads()`` as a training step calls it: ``p.grad`` is already the bucket's
    view (bound by a first round), the refill writes the new gradient into it (as backward
    does), and the timed call includes whatever gather, scale and scatter the strategy does."""
    param = torch.nn.Parameter(torch.zeros(src.numel()))
    param.grad = src.clone()
    sync = comm_lib.create(name, [param], topo, bucket_bytes=src.numel() * 4, compression=codec,
                           tune="measure")
    sync.allreduce_grads()
    return (sync.allreduce_grads, lambda: param.grad.copy_(src)), sync


def case_strategy(name, codec, topo, src):
    param = torch.nn.Parameter(torch.zeros(src.numel()))
    param.grad = src
    sync = comm_lib.create(name, [param], topo, bucket_bytes=src.numel() * 4, compression=codec,
                           tune="measure")
    bucket = sync.buckets[0]
    sync.blocking_round = True      # as in allreduce_grads(): a round started only to wait for it
    # The refill is the strategy's own gather (a copy, or a copy that pre-divides).
    return (lambda: run(sync.reduce_bucket(bucket)),
            lambda: bucket.gather_grads(sync.gather_scale)), sync


def init_gloo(comm):
    """torch.distributed over gloo on ``comm``'s ranks, rendezvous by MPI (hpctrain.ddp's store:
    rank 0's node address, ``HPCTRAIN_NODE_ADDR`` on the emulated cluster, a free port)."""
    import torch.distributed as dist

    from hpctrain.ddp.process_group import open_store
    dist.init_process_group("gloo", store=open_store(comm), rank=comm.Get_rank(), world_size=comm.Get_size())
    return dist


def case_gloo(dist, src):
    buf = src.clone()
    return (lambda: dist.all_reduce(buf), lambda: buf.copy_(src)), None


def measure(args, comm) -> list[dict]:
    topo = Topology.create(comm, args.ranks_per_node)
    dist = None if args.no_gloo else init_gloo(comm)
    rows, n = [], comm.Get_size()
    rng = np.random.default_rng(comm.Get_rank())
    for n_bytes in args.sizes:
        src = torch.from_numpy(rng.standard_normal(n_bytes // 4).astype(np.float32))
        pairs = [(s, c) for s in args.strategies for c in args.compressions]
        names = [("mpi4py", "none", "collective"), ("mpi4py", "none", "+mean")]
        built = [case_mpi4py(comm, src), case_mpi4py_mean(comm, src)]
        names += [(s, c, "collective") for s, c in pairs]
        built += [case_strategy(s, c, topo, src) for s, c in pairs]
        if args.whole:
            names += [(s, c, "whole") for s, c in pairs]
            built += [case_whole(s, c, topo, src) for s, c in pairs]
        floor = case_memory_floor(topo, src)
        if floor is not None:
            names.append(("memory", "none", "floor"))
            built.append(floor)
        if dist is not None:
            names.append(("gloo", "none", "collective"))
            built.append(case_gloo(dist, src))
        try:
            times = timed_round_robin(comm, [case for case, _ in built], args.iters, args.warmup)
        finally:
            for _, sync in built:
                if sync is not None:
                    sync.close()
        for (impl, codec, scope), t in zip(names, times):
            algbw, busbw = bandwidths(n_bytes, t, n)
            rows.append({"impl": impl, "compression": codec, "scope": scope, "ranks_per_node": topo.local_size,
                         "world_size": n, "bytes": n_bytes, "time_s": t,
                         "algbw_GBps": algbw, "busbw_GBps": busbw})
    if dist is not None:
        dist.destroy_process_group()
    topo.close()
    return rows


def format_table(rows) -> str:
    """One line per (size, impl): time, bandwidths, speed-up over mpi4py and over gloo."""
    base = {(r["bytes"]): r["time_s"] for r in rows if r["impl"] == "mpi4py" and r["scope"] == "collective"}
    gloo = {(r["bytes"]): r["time_s"] for r in rows if r["impl"] == "gloo"}
    head = (f"{'bytes':>10} {'impl':<13} {'comp':<5} {'scope':<10} {'time_ms':>9} {'algbw':>7} {'busbw':>7} "
            f"{'x mpi4py':>9} {'x gloo':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        t, b = r["time_s"], r["bytes"]
        vs_g = f"{gloo[b] / t:7.2f}" if b in gloo else f"{'-':>7}"
        lines.append(f"{_human(b):>10} {r['impl']:<13} {r['compression']:<5} {r['scope']:<10} {t * 1e3:9.3f} "
                     f"{r['algbw_GBps']:7.2f} {r['busbw_GBps']:7.2f} {base[b] / t:9.2f} {vs_g}")
    return "\n".join(lines)


def _human(n_bytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= size and n_bytes % size == 0:
            return f"{n_bytes // size}{unit}"
    return f"{n_bytes}B"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="hpctrain bench allreduce", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   type=lambda s: [parse_size(x) for x in s.split(",") if x],
                   help=f"comma-separated fp32 payload sizes (default {DEFAULT_SIZES})")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per size (median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    p.add_argument("--ranks-per-node", type=int, default=0,
                   help="emulate K ranks per node for hierarchical (0: real nodes)")
    p.add_argument("--strategies", default=",".join(comm_lib.concrete()),
                   type=lambda s: s.split(","))
    p.add_argument("--compressions", default="none,fp16", type=lambda s: s.split(","))
    p.add_argument("--no-gloo", action="store_true", help="skip the torch.distributed peer")
    p.add_argument("--no-whole", dest="whole", action="store_false",
                   help="skip the whole allreduce_grads() rows (gather + collective + scatter)")
    p.add_argument("--json", metavar="FILE", help="write the rows as a JSON list")
    return p.parse_args(argv)


def header(args, comm, rows) -> str:
    return (f"allreduce: {comm.Get_size()} ranks, ranks_per_node={args.ranks_per_node or 'real'}, "
            f"median of {args.iters} (after {args.warmup} warm-up), 1-min load {{load}}")


def main(argv) -> int:
    return run_mpi_bench(argv, parse_args, measure, format_table, header)
