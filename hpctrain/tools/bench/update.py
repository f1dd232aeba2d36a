"""Update-algorithm benchmark: OD-SGD against SSGD, steps/s and the share of communication hidden.

    mpiexec -n 2 .venv/bin/python -m hpctrain bench sync [--model resnet18] [--image-size 16]
            [--batch 16] [--steps 20] [--repeats 3] [--comm-delay-ms 0,40]
            [--strategy flat] [--compression none] [--overlap] [--json FILE]

Same model, ranks, network and synthetic data for both algorithms (OD-SGD without warm-up: the
steady state is measured). For each injected link latency (``--comm-delay-ms``, see
:mod:`hpctrain.comm.delay`) the two algorithms alternate ``--repeats`` times (so background
load hits both alike); each run times ``--steps`` steps after 3 untimed ones, ending with
``trainer.finish()``; a run's time is the slowest rank's, the table shows the median run.

Columns: steps/s (median run) and ``x SSGD``, the median over repeats of the ratio of each run
to the SSGD run just before it (same background load); per-step phases in ms, averaged over
ranks: forward, backward, ``comm`` = communication the step *waits for* (SSGD: the whole
allreduce; OD-SGD: starting the next one plus what is left of the previous one), ``update``
(optimiser; OD-SGD: global + local update). ``comm %`` = comm / step time; ``hidden`` = the
share of SSGD's communication time that OD-SGD does not wait for: 1 - comm(OD-SGD)/comm(SSGD).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from mpi4py import MPI

from hpctrain.models import build_model
from hpctrain.ops.metrics import StepTimer
from hpctrain.tools.bench.report import run_mpi_bench
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

UNTIMED_STEPS = 3
ALGORITHMS = ("ssgd", "odsgd")


def phase_ms(totals: dict, steps: int) -> dict:
    """Per-step milliseconds of the timer's phases, grouped as the table shows them."""
    ms = {k: v * 1e3 / steps for k, v in totals.items()}
    return {"forward": ms.get("forward", 0.0), "backward": ms.get("backward", 0.0),
            "comm": ms.get("allreduce", 0.0),
            "update": ms.get("optimizer", 0.0) + ms.get("local_update", 0.0)}


def hidden_share(comm_ssgd_ms: float, comm_odsgd_ms: float) -> float:
    """Share of SSGD's communication wait that OD-SGD does not wait for."""
    return 1.0 - comm_odsgd_ms / comm_ssgd_ms if comm_ssgd_ms > 0 else 0.0


def pair_speedup(base_runs: list[float], runs: list[float]) -> float:
    """Median over repeats of run i's steps/s over the baseline's run i (run just before it, so
    both saw the same background load: steadier than a ratio of medians on a shared host)."""
    return statistics.median(r / b for r, b in zip(runs, base_runs))


def one_run(args, topo: Topology, algorithm: str, delay_ms: float, data) -> dict:
    """Build a trainer, run untimed then timed steps; the slowest rank's time and mean phases."""
    comm = topo.comm
    torch.manual_seed(0)
    model = build_model(args.model, num_classes=10, in_channels=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    timer = StepTimer()
    options = {"warmup_steps": 0} if algorithm == "odsgd" else {}
    trainer = DistributedTrainer(model, opt, topo, strategy=args.strategy, compression=args.compression,
                                 bucket_mb=args.bucket_mb, overlap=args.overlap, algorithm=algorithm,
                                 algorithm_options=options, timer=timer, comm_delay_ms=delay_ms)
    x, y = data
    for _ in range(UNTIMED_STEPS):
        trainer.step(x, y)
    trainer.finish()
    timer.reset()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        trainer.step(x, y)
    trainer.finish()
    wall_s = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    phases = phase_ms(timer.reset(), args.steps)
    phases = {k: comm.allreduce(v) / comm.Get_size() for k, v in phases.items()}
    n_params = sum(p.numel() for p in model.parameters())
    trainer.close()
    return {"algorithm": algorithm, "delay_ms": delay_ms, "steps_per_s": args.steps / wall_s,
            "step_ms": wall_s * 1e3 / args.steps, "n_params": n_params, **phases}


def measure(args, comm) -> list[dict]:
    topo = Topology.create(comm, args.ranks_per_node)
    g = torch.Generator().manual_seed(1000 + comm.Get_rank())
    data = (torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g),
            torch.randint(0, 10, (args.batch,), generator=g))
    rows = []
    for delay_ms in args.comm_delay_ms:
        runs: dict[str, list[dict]] = {a: [] for a in ALGORITHMS}
        for _ in range(args.repeats):
            for algorithm in ALGORITHMS:
                runs[algorithm].append(one_run(args, topo, algorithm, delay_ms, data))
        for algorithm in ALGORITHMS:
            by_speed = sorted(runs[algorithm], key=lambda r: r["steps_per_s"])
            rows.append({**by_speed[len(by_speed) // 2], "world_size": comm.Get_size(),
                         "runs_steps_per_s": [r["steps_per_s"] for r in runs[algorithm]]})
    topo.close()
    base = {r["delay_ms"]: r for r in rows if r["algorithm"] == "ssgd"}
    for r in rows:
        b = base[r["delay_ms"]]
        r["speedup"] = pair_speedup(b["runs_steps_per_s"], r["runs_steps_per_s"])
        r["comm_share"] = r["comm"] / r["step_ms"]
        r["hidden"] = hidden_share(b["comm"], r["comm"]) if r["algorithm"] == "odsgd" else None
    return rows


def format_table(rows) -> str:
    head = (f"{'delay_ms':>8} {'algorithm':<9} {'steps/s':>8} {'x SSGD':>7} {'step_ms':>8} {'fwd':>7} "
            f"{'bwd':>7} {'comm':>7} {'update':>7} {'comm %':>7} {'hidden':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        hidden = f"{r['hidden']:7.0%}" if r["hidden"] is not None else f"{'-':>7}"
        lines.append(f"{r['delay_ms']:8g} {r['algorithm']:<9} {r['steps_per_s']:8.2f} {r['speedup']:7.2f} "
                     f"{r['step_ms']:8.1f} {r['forward']:7.1f} {r['backward']:7.1f} {r['comm']:7.1f} "
                     f"{r['update']:7.1f} {r['comm_share']:7.0%} {hidden}")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="hpctrain bench sync", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18", help="built-in model name or package.module:factory")
    p.add_argument("--image-size", type=int, default=16, help="synthetic square RGB images, pixels")
    p.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--repeats", type=int, default=3, help="runs per algorithm and delay (median)")
    p.add_argument("--comm-delay-ms", default=[0.0, 40.0], type=lambda s: [float(v) for v in s.split(",") if v],
                   help="comma-separated injected link latencies (default 0,40)")
    p.add_argument("--strategy", default="flat")
    p.add_argument("--compression", default="none")
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--overlap", action="store_true", help="start bucket allreduces during backward (both)")
    p.add_argument("--ranks-per-node", type=int, default=0, help="emulate K ranks per node (0: real nodes)")
    p.add_argument("--json", metavar="FILE", help="write the rows as a JSON list")
    args = p.parse_args(argv)
    if min(args.comm_delay_ms, default=0.0) < 0 or args.steps < 1 or args.repeats < 1 or args.batch < 1:
        p.error("--comm-delay-ms must be >= 0; --steps, --repeats and --batch positive")
    return args


def header(args, comm, rows) -> str:
    mb = rows[0]["n_params"] * 4 / 2**20
    return (f"sync: {args.model} ({rows[0]['n_params'] / 1e6:.2f} M parameters, {mb:.1f} MiB of fp32 "
            f"gradients), {comm.Get_size()} ranks, batch {args.batch}/rank at {args.image_size} px, "
            f"{args.strategy}/{args.compression}, overlap={args.overlap}; median of {args.repeats} "
            f"runs of {args.steps} steps, 1-min load {{load}}")


def main(argv) -> int:
    return run_mpi_bench(argv, parse_args, measure, format_table, header)
