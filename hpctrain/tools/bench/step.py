"""Training-step benchmark: hpctrain configurations against torch DDP (gloo), in one MPI job.

    mpiexec -n 2 .venv/bin/python -m hpctrain bench step [--models digits_cnn,resnet20,mlp]
            [--configs default,flat,...] [--batch 32] [--steps 8] [--rounds 5] [--json FILE]
            [--budget-steps 8] [--budget-trace PREFIX]

What users compare: whole steps (forward, backward, gradient sync, SGD-momentum update) on
synthetic data, per-rank batch ``--batch``. Contenders (``--configs``):

* ``nocomm``  the same model and optimiser with no gradient sync: the compute floor;
* ``ddp``     ``torch.nn.parallel.DistributedDataParallel`` over gloo with its defaults (the
              baseline of every ratio); ``horovod`` (``hvd.DistributedOptimizer``) when
              ``horovod.torch`` imports;
* hpctrain ``DistributedTrainer``: ``default`` (``CommConfig``'s defaults, what a user who sets
              nothing runs), and ``STRATEGY[+fp16][+overlap][+compile]`` (e.g. ``flat``,
              ``hierarchical+overlap``, ``flat+fp16``); ``+compile`` is ``model.compile = true``:
              the model's forward compiled in place after the trainer's broadcast, as the job
              does (``default+compile``: the compiled row). Its compile happens in the warm-up.

Where (``--device``, default ``auto``): on a GPU node every rank's model, data, optimiser state
and DDP live on its GPU (``hpctrain.api.bind_device``; DDP with ``device_ids``, gloo moving
CUDA tensors), and each timed run ends with a device synchronisation, so a figure is the GPU's
time, not the time to queue kernels; elsewhere on the CPU. The row and the header say which
device gave the figure.

Every contender holds its own replica (same initial weights, same data). A round runs every
contender for ``--steps`` timed steps (after ``--warmup`` untimed ones in the first round) in an
order that rotates from round to round, so background load on a shared host hits all of them
alike; a run's time is the slowest rank's. The table shows the median ms/step over rounds and,
per contender, the median over rounds of the paired ratio DDP time / contender time (> 1: faster
than DDP), steadier than a ratio of medians.

After the rounds, every hpctrain contender runs ``--budget-steps`` instrumented steps: where the
step's time goes, phase by phase and bucket by bucket, beside its physical floor
(:mod:`hpctrain.tools.bench.budget`, :mod:`hpctrain.tools.bench.floor`; CPU runs only).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
from collections.abc import Callable

import torch
from mpi4py import MPI
from torch import nn

from hpctrain.api import bind_device
from hpctrain.errors import ConfigError
from hpctrain.job.config import CommConfig
from hpctrain.models import build_model
from hpctrain.models.compiled import compile_model
from hpctrain.tools.bench.allreduce import init_gloo
from hpctrain.tools.bench.args import add_round_args, check_round_args
from hpctrain.tools.bench.budget import format_budget, measure_budget
from hpctrain.tools.bench.report import run_mpi_bench
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

DEFAULT_MODELS = "digits_cnn,resnet20,mlp"
DEFAULT_CONFIGS = ("nocomm,ddp,horovod,default,default+compile,flat,flat+overlap,hierarchical,hierarchical+overlap,"
                   "flat+fp16,flat+fp16+overlap")
CPU = torch.device("cpu")
INPUTS = {"digits_cnn": (1, 8, 8), "resnet20": (3, 32, 32), "mlp": (1, 8, 8)}


def mlp(num_classes: int = 10, in_features: int = 64, width: int = 2048, depth: int = 4) -> nn.Module:
    """The communication-heavy model: ``depth`` hidden layers of ``width`` (4x2048 on 8x8 inputs:
    12.7 M parameters, 49 MiB of fp32 gradients for ~70 ms of compute per 32 samples here)."""
    layers: list[nn.Module] = [nn.Flatten()]
    n_in = in_features
    for _ in range(depth):
        layers += [nn.Linear(n_in, width), nn.ReLU()]
        n_in = width
    return nn.Sequential(*layers, nn.Linear(n_in, num_classes))


def make_model(name: str) -> nn.Module:
    if name == "mlp":
        return mlp()
    return build_model(name, num_classes=10, in_channels=INPUTS[name][0])


def parse_config(name: str) -> dict:
    """``default`` -> CommConfig's defaults; ``flat+fp16+overlap`` -> strategy, compression, overlap;
    ``+compile`` adds ``compile: True`` (the model compiled, :func:`build`)."""
    d = CommConfig()
    strategy, *flags = name.split("+")
    unknown = set(flags) - {"fp16", "overlap", "compile"}
    if unknown:
        raise ValueError(f"--configs: unknown flag(s) {sorted(unknown)} in {name!r} (fp16, overlap, compile)")
    default = strategy == "default"
    options = {"strategy": d.strategy if default else strategy,
               "compression": "fp16" if "fp16" in flags else d.compression if default else "none",
               "overlap": "overlap" in flags or (default and d.overlap), "bucket_mb": d.bucket_mb}
    return {**options, "compile": True} if "compile" in flags else options


def horovod_available() -> bool:
    try:
        import horovod.torch  # noqa: F401
    except Exception:        # ImportError, or a build without torch support
        return False
    return True


class Contender:
    """One configuration: ``step(x, y)`` runs a whole training step; ``close()`` releases it;
    ``describe()`` says what it is (default: its name)."""

    def __init__(self, name: str, model: nn.Module, step, close=lambda: None,
                 describe: Callable[[], str] | None = None, trainer=None, optimizer=None):
        self.name, self.model, self.step, self.close = name, model, step, close
        self.describe: Callable[[], str] = describe or (lambda: name)
        self.trainer, self.optimizer = trainer, optimizer     # hpctrain's: what the budget instruments


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def plain_step(forward: nn.Module, opt, loss_fn):
    """forward, backward, ``opt.step()``: the peers' whole step (their sync runs inside)."""
    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss_fn(forward(x), y).backward()
        opt.step()
    return step


def build(name: str, base: nn.Module, topo: Topology, dist, device=CPU) -> Contender | None:
    """The contender called ``name`` on a copy of ``base`` on ``device`` (None: not available here)."""
    model = copy.deepcopy(base).to(device)
    loss_fn = nn.CrossEntropyLoss()
    if name == "nocomm":
        return Contender(name, model, plain_step(model, sgd(model), loss_fn))
    if name == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        return Contender(name, model, plain_step(ddp, sgd(ddp), loss_fn))
    if name == "horovod":
        if not horovod_available():
            return None
        import horovod.torch as hvd
        hvd.init()
        opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        return Contender(name, model, plain_step(model, opt, loss_fn))
    options = parse_config(name)
    compiled = options.pop("compile", False)
    opt = sgd(model)
    trainer = DistributedTrainer(model, opt, topo, loss_fn=loss_fn, **options)
    if compiled:                           # after the broadcast, in place, as the job does
        compile_model(model, "default", device.type)
    text = getattr(trainer.grad_sync, "describe", lambda: "")()     # as built, before any step
    return Contender(name, model, trainer.step, trainer.close, describe=(lambda: text) if text else None,
                     trainer=trainer, optimizer=opt)


def settle(device: torch.device) -> None:
    """Wait for the device's queued work (a GPU runs behind the host; the CPU does not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(comm: MPI.Comm, contender: Contender, data, steps: int, device=CPU) -> float:
    """Seconds per step over ``steps`` steps, the slowest rank's (device work included)."""
    x, y = data
    settle(device)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        contender.step(x, y)
    settle(device)
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) / steps


def make_data(model_name: str, batch: int, rank: int, device=CPU) -> tuple[torch.Tensor, torch.Tensor]:
    """A rank's synthetic batch (drawn on the CPU, the same for any device), on ``device``."""
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(batch, *INPUTS[model_name], generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return x.to(device), y.to(device)


def trace_path(prefix: str | None, model_name: str, config: str) -> str | None:
    """``--budget-trace PREFIX``: one Chrome trace per hpctrain contender, PREFIX-MODEL-CONFIG.json."""
    return f"{prefix}-{model_name}-{config.replace('+', '_')}.json" if prefix else None


def paired_ratios(base: list[float], times: list[float]) -> float:
    """Median over rounds of base_time / time (throughput relative to the baseline)."""
    return statistics.median(b / t for b, t in zip(base, times))


def measure_model(args, comm, topo, dist, model_name: str, device=CPU) -> list[dict]:
    torch.manual_seed(0)
    base = make_model(model_name)
    n_params = sum(p.numel() for p in base.parameters())
    data = make_data(model_name, args.batch, comm.Get_rank(), device)
    contenders = []
    with contextlib.ExitStack() as stack:
        for name in args.configs:
            c = build(name, base, topo, dist, device)
            if c is not None:
                stack.callback(c.close)
                contenders.append(c)
        for c in contenders:                     # warm-up: allocation, lazy set-up, caches
            time_steps(comm, c, data, args.warmup, device)
        times: dict[str, list[float]] = {c.name: [] for c in contenders}
        for r in range(args.rounds):
            for k in range(len(contenders)):
                c = contenders[(k + r) % len(contenders)]
                times[c.name].append(time_steps(comm, c, data, args.steps, device))
        budgets = {c.name: measure_budget(comm, c.trainer, c.optimizer, data, args.budget_steps,
                                          trace_path(args.budget_trace, model_name, c.name))
                   for c in contenders if c.trainer is not None and args.budget_steps
                   and device.type == "cpu"}   # after the rounds; host clocks: a GPU's time is not the host's
    base_times = times.get("ddp")
    rows = []
    for c in contenders:
        t = times[c.name]
        rows.append({"model": model_name, "n_params": n_params, "config": c.name, "describe": c.describe(),
                     "device": str(device),
                     "world_size": comm.Get_size(), "batch_per_rank": args.batch,
                     "step_ms": statistics.median(t) * 1e3, "rounds_ms": [v * 1e3 for v in t],
                     "x_ddp": paired_ratios(base_times, t) if base_times else None,
                     "budget": budgets.get(c.name)})
    return rows


def measure(args, comm) -> list[dict]:
    topo = Topology.create(comm, args.ranks_per_node)
    try:
        device = bind_device(topo, getattr(args, "device", "auto"))
    except ConfigError as exc:
        topo.close()
        raise SystemExit(f"bench step --device: {exc}") from None
    dist = init_gloo(comm) if "ddp" in args.configs else None
    try:
        return [row for m in args.models for row in measure_model(args, comm, topo, dist, m, device)]
    finally:
        if dist is not None:
            dist.destroy_process_group()
        topo.close()


def format_table(rows) -> str:
    """One line per (model, config): ms/step, x DDP, and what ``default`` chose (the whole
    ``describe()`` line of every contender is in the JSON rows)."""
    head = f"{'model':<11} {'params':>7} {'config':<22} {'ms/step':>8} {'x DDP':>6}  chosen"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['x_ddp']:6.2f}" if r["x_ddp"] is not None else f"{'-':>6}"
        lines.append(f"{r['model']:<11} {r['n_params'] / 1e6:6.2f}M {r['config']:<22} {r['step_ms']:8.1f} "
                     f"{ratio}  {r['describe'].split(',')[0] if r['config'] == 'default' else ''}")
    if any(r.get("budget") for r in rows):
        lines += ["", format_budget(rows)]
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="hpctrain bench step", description=__doc__.split("\n")[0])
    add_round_args(p, DEFAULT_MODELS, INPUTS, configs=(DEFAULT_CONFIGS, "comma-separated contenders: nocomm, ddp, "
                                                      "horovod, default, STRATEGY[+fp16][+overlap][+compile]"))
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="where the models train: auto (the rank's GPU when torch sees one, else the CPU)")
    p.add_argument("--budget-steps", type=int, default=8, metavar="N",
                   help="instrumented steps per hpctrain contender after the rounds, for the per-step "
                        "budget and floor (0: none)")
    p.add_argument("--budget-trace", metavar="PREFIX",
                   help="write the budget's spans, every rank, as Chrome traces PREFIX-MODEL-CONFIG.json")
    args = check_round_args(p, p.parse_args(argv), INPUTS,
                            lambda c: c in ("nocomm", "ddp", "horovod") or parse_config(c))
    if args.budget_steps < 0:
        p.error("--budget-steps must be >= 0")
    return args


def header(args, comm, rows) -> str:
    where = rows[0].get("device", "cpu") if rows else "cpu"
    return (f"step: {comm.Get_size()} ranks on {where}, batch {args.batch}/rank, SGD momentum, synthetic data; "
            f"median of {args.rounds} rounds of {args.steps} steps, contenders interleaved; "
            f"x DDP = median of paired ratios; 1-min load {{load}}")


def main(argv) -> int:
    return run_mpi_bench(argv, parse_args, measure, format_table, header)
