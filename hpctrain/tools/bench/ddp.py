"""DDP benchmark: torch DDP with hpctrain's communication hook against DDP's own gloo allreduce.

    mpiexec -n 2 .venv/bin/python -m hpctrain bench ddp [--models mlp,digits_cnn,resnet20]
            [--configs ddp,hook,hook+fp16] [--batch 32] [--steps 8] [--rounds 5] [--json FILE]

The same script twice: ``DistributedDataParallel(model)`` with its defaults, once as it comes
(``ddp``: gloo's allreduce, the baseline) and once with ``hpctrain.ddp.register(ddp_model)``
(``hook``: ``auto`` strategy, shared-memory ``hierarchical`` where a node holds several ranks;
``hook+fp16``, ``hook:flat``, ``hook:flat+fp16``: other strategies and the fp16 wire); ``nocomm``
(no sync) and ``trainer`` (``DistributedTrainer``'s defaults, the loop rewritten) for reference. The
process group comes from ``hpctrain.ddp.init_process_group()``. Models, data, warm-up, the
interleaved rounds and the paired ratios are those of ``bench step`` (:mod:`hpctrain.tools.bench.step`):
whole SGD-momentum steps on synthetic data, every contender on its own replica, the order
rotating from round to round, a run's time the slowest rank's; ``x DDP`` is the median over
rounds of DDP's time / the contender's (> 1: faster than DDP).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics

import torch
from torch import nn

import hpctrain.ddp
from hpctrain.tools.bench import step as bench_step
from hpctrain.tools.bench.args import add_round_args, check_round_args
from hpctrain.tools.bench.report import run_mpi_bench
from hpctrain.tools.bench.step import INPUTS, Contender, make_model, paired_ratios, plain_step, sgd, time_steps
from hpctrain.topology import Topology

DEFAULT_MODELS = "mlp,digits_cnn,resnet20"
DEFAULT_CONFIGS = "nocomm,ddp,hook,hook+fp16"


def parse_config(name: str) -> dict | None:
    """``ddp``/``nocomm``/``trainer`` -> None (no hook); ``hook[:STRATEGY][+fp16]`` -> HookState
    options."""
    if name in ("ddp", "nocomm", "trainer"):
        return None
    head, *flags = name.split("+")
    kind, _, strategy = head.partition(":")
    if kind != "hook" or set(flags) - {"fp16"}:
        raise ValueError(f"--configs: {name!r} is not ddp or hook[:STRATEGY][+fp16]")
    return {"strategy": strategy or "auto", "compression": "fp16" if flags else "none"}


def build(name: str, base: nn.Module, topo: Topology) -> Contender:
    model = copy.deepcopy(base)
    if name == "nocomm":
        return Contender(name, model, plain_step(model, sgd(model), nn.CrossEntropyLoss()),
                         describe=lambda: "no gradient sync")
    if name == "trainer":       # the same model on DistributedTrainer's defaults (bench step's)
        c = bench_step.build("default", base, topo, None)
        assert c is not None            # "default" is always available
        c.name = name
        return c
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    options = parse_config(name)
    state = None
    if options is not None:
        state = hpctrain.ddp.register(ddp, topology=topo, quiet=True, **options)
    step = plain_step(ddp, sgd(ddp), nn.CrossEntropyLoss())
    return Contender(name, model, step, close=state.close if state else (lambda: None),
                     describe=(lambda: state.describe().replace("\n", "; ")) if state else (lambda: "gloo allreduce"))


def measure_model(args, comm, topo, model_name: str) -> list[dict]:
    torch.manual_seed(0)
    base = make_model(model_name)
    n_params = sum(p.numel() for p in base.parameters())
    g = torch.Generator().manual_seed(1000 + comm.Get_rank())
    data = (torch.randn(args.batch, *INPUTS[model_name], generator=g),
            torch.randint(0, 10, (args.batch,), generator=g))
    with contextlib.ExitStack() as stack:
        contenders = []
        for name in args.configs:
            c = build(name, base, topo)
            stack.callback(c.close)
            contenders.append(c)
        for c in contenders:            # warm-up: DDP's bucket rebuild, the hook's syncs, caches
            time_steps(comm, c, data, args.warmup)
        times: dict[str, list[float]] = {c.name: [] for c in contenders}
        for r in range(args.rounds):
            for k in range(len(contenders)):
                c = contenders[(k + r) % len(contenders)]
                times[c.name].append(time_steps(comm, c, data, args.steps))
        described = {c.name: c.describe() for c in contenders}
    base_times = times.get("ddp")
    return [{"model": model_name, "n_params": n_params, "config": name, "describe": described[name],
             "world_size": comm.Get_size(), "batch_per_rank": args.batch,
             "steps_per_s": 1.0 / statistics.median(t), "step_ms": statistics.median(t) * 1e3,
             "rounds_ms": [v * 1e3 for v in t],
             "x_ddp": paired_ratios(base_times, t) if base_times else None}
            for name, t in times.items()]


def measure(args, comm) -> list[dict]:
    hpctrain.ddp.init_process_group("gloo")
    topo = Topology.create(comm, args.ranks_per_node)
    try:
        return [row for m in args.models for row in measure_model(args, comm, topo, m)]
    finally:
        topo.close()
        hpctrain.ddp.destroy_process_group()


def format_table(rows) -> str:
    head = f"{'model':<11} {'params':>7} {'config':<16} {'ms/step':>8} {'steps/s':>8} {'x DDP':>6}  how"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['x_ddp']:6.2f}" if r["x_ddp"] is not None else f"{'-':>6}"
        how = r["describe"].split("; ")[0].split(", ", 1)[-1]      # the first bucket's
        if r["config"] == "trainer":
            how = "DistributedTrainer: " + r["describe"].split(", overlap")[0]
        lines.append(f"{r['model']:<11} {r['n_params'] / 1e6:6.2f}M {r['config']:<16} {r['step_ms']:8.1f} "
                     f"{r['steps_per_s']:8.2f} {ratio}  {how}")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="hpctrain bench ddp", description=__doc__.split("\n")[0])
    add_round_args(p, DEFAULT_MODELS, INPUTS, warmup=3, configs=(
        DEFAULT_CONFIGS, "comma-separated: nocomm (no DDP, no sync: the compute floor), ddp, hook[:STRATEGY][+fp16], "
                         "trainer (hpctrain.DistributedTrainer's defaults, no DDP) (default %(default)s)"))
    return check_round_args(p, p.parse_args(argv), INPUTS, parse_config)


def header(args, comm, rows) -> str:
    return (f"ddp: {comm.Get_size()} ranks, batch {args.batch}/rank, SGD momentum, synthetic data; DDP "
            f"defaults (25 MiB buckets); median of {args.rounds} rounds of {args.steps} steps, "
            f"contenders interleaved; x DDP = median of paired ratios vs gloo; 1-min load {{load}}")


def main(argv) -> int:
    return run_mpi_bench(argv, parse_args, measure, format_table, header)
