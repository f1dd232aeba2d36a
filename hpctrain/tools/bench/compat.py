"""Horovod's synthetic benchmark on ``hpctrain.horovod``, ``DistributedTrainer`` and real Horovod.

    python -m hpctrain bench compat [--models resnet18,resnet50,mlp] [--np 2] [--batch 16]
            [--image-size 64] [--steps 4] [--rounds 4] [--fp16] [--horovod-python PY] [--json FILE]

The workload is Horovod's ``pytorch_synthetic_benchmark.py``: fixed random images, plain SGD,
``zero_grad``/forward/cross-entropy/backward/``step`` per batch, ``--batch`` images per rank;
``mlp`` is the communication-heavy model of ``bench step`` (12.7 M parameters on 8x8 inputs).
Images/s is the total over ranks, at the slowest rank's pace.

Run it without ``mpiexec``: it is a driver that starts one MPI job per implementation and round
and alternates them (the order swaps every round), because real Horovod cannot share a process
with the others fairly: its background thread negotiates over MPI every few milliseconds while
it is initialised, which would tax whatever runs beside it. Inside the hpctrain job,
``hpctrain.horovod`` (``hvd.DistributedOptimizer``) and ``DistributedTrainer`` with the same
settings (strategy ``auto``, the same bucket size, ``--fp16`` for both) alternate step by step
on the same data, so a burst of load from elsewhere hits both alike; a job's figure for a
contender is its median step. Real Horovod runs from ``--horovod-python`` (default ``$HOROVOD_PYTHON``, else
``/tmp/hvd-venv/bin/python`` as ``scripts/build-horovod`` makes it, else this Python) where
``import horovod.torch`` works there, and is left out with a note otherwise.

Ratios are medians over rounds of per-round ratios: ``x Trainer`` against the
``DistributedTrainer`` of the same job, ``x Horovod`` against real Horovod in the adjacent job.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from hpctrain.tools.bench.args import add_round_args, check_round_args
from hpctrain.tools.bench.report import one_minute_load

OURS, TRAINER, HOROVOD = "hpctrain.horovod", "DistributedTrainer", "horovod 0.28.1"
DEFAULT_MODELS = "resnet18,resnet50,mlp"
NUM_CLASSES = {"resnet18": 1000, "resnet50": 1000, "mlp": 10}


# -- the worker: one MPI job, one round ----------------------------------------------------------

def make_model(name: str, image_size: int):
    """(model, one sample's shape), identical in every job (seeded)."""
    import torch
    torch.manual_seed(0)
    if name == "mlp":
        from hpctrain.tools.bench.step import mlp
        return mlp(), (1, 8, 8)
    try:
        from torchvision import models
    except Exception:               # torchvision's operators do not load beside this torch
        from hpctrain.models import resnet as models
    return getattr(models, name)(num_classes=NUM_CLASSES[name]), (3, image_size, image_size)


def synthetic_batch(rank: int, batch: int, shape, num_classes: int):
    import torch
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(batch, *shape, generator=g), torch.randint(0, num_classes, (batch,), generator=g)


def horovod_step(hvd, model, data, target, fp16: bool):
    """Horovod's benchmark step on ``hvd`` (hpctrain's or Horovod's module); returns (step, close)."""
    import torch
    import torch.nn.functional as F
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.fp16 if fp16 else hvd.Compression.none)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()
    return step, getattr(opt, "close", lambda: None)


def trainer_step(model, data, target, fp16: bool, topo):
    import torch

    from hpctrain.trainer import DistributedTrainer
    trainer = DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.01), topo,
                                 strategy="auto", compression="fp16" if fp16 else "none",
                                 overlap=False, loss_fn=torch.nn.CrossEntropyLoss())
    return (lambda: trainer.step(data, target)), trainer.close


def timed(step) -> float:
    """Seconds for one step on this rank. No MPI call of its own between steps: an extra
    barrier per step from the training thread slowed real Horovod (whose background thread
    makes MPI calls too) by up to 2x here, against Horovod's own benchmark loop."""
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def worker(args) -> dict:
    """{model: {contender: seconds per step}} for this job's implementation."""
    import copy

    import numpy as np
    import torch
    from mpi4py import MPI
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    if args.worker == "horovod":
        import horovod.torch as hvd
    else:
        import hpctrain.horovod.torch as hvd
        from hpctrain.topology import Topology
        topo = Topology.create(comm)
    hvd.init()
    out = {}
    for name in args.models:
        base, shape = make_model(name, args.image_size)
        data, target = synthetic_batch(comm.Get_rank(), args.batch, shape, NUM_CLASSES[name])
        contenders = {(HOROVOD if args.worker == "horovod" else OURS):
                      horovod_step(hvd, copy.deepcopy(base), data, target, args.fp16)}
        if args.worker == "hpctrain":
            contenders[TRAINER] = trainer_step(copy.deepcopy(base), data, target, args.fp16, topo)
        try:
            for step, _ in contenders.values():
                for _ in range(args.warmup):
                    step()
            names = list(contenders)
            seconds: dict[str, list[float]] = {c: [] for c in names}
            comm.Barrier()
            for i in range(args.steps):                      # step by step, ABBA: a burst of
                pair = names if (i + args.round) % 2 == 0 else names[::-1]  # load hits both alike
                for c in pair:
                    seconds[c].append(timed(contenders[c][0]))
            # each step's time is the slowest rank's (one reduction per contender, after timing)
            medians = {}
            for c, t in seconds.items():
                slowest = np.array(t)
                comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
                medians[c] = float(np.median(slowest))
            out[name] = medians
        finally:
            for _, close in contenders.values():
                close()
    hvd.shutdown()
    if args.worker == "hpctrain":
        topo.close()
    return out


# -- the driver: alternate the jobs, then the table ----------------------------------------------

def horovod_python(args) -> str | None:
    """The interpreter where ``import horovod.torch`` works, or None."""
    candidates = [args.horovod_python] if args.horovod_python else [
        os.environ.get("HOROVOD_PYTHON"), "/tmp/hvd-venv/bin/python", sys.executable]
    for py in filter(None, candidates):
        if os.path.exists(py) and subprocess.run([py, "-c", "import horovod.torch"], capture_output=True,
                                                 env=worker_env()).returncode == 0:
            return py
    return None


def worker_env() -> dict:
    """This checkout's hpctrain first on the path of every job, whatever its interpreter."""
    import hpctrain
    root = os.path.dirname(os.path.dirname(os.path.abspath(hpctrain.__file__)))
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def run_job(args, impl: str, python: str, r: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        cmd = [*shlex.split(args.mpiexec), "-n", str(args.np), python, "-m", "hpctrain", "bench", "compat",
               "--worker", impl, "--round", str(r), "--out", out, "--models", ",".join(args.models),
               "--batch", str(args.batch), "--image-size", str(args.image_size), "--steps", str(args.steps),
               "--warmup", str(args.warmup)] + (["--fp16"] if args.fp16 else [])
        p = subprocess.run(cmd, capture_output=True, text=True, env=worker_env())
        if p.returncode != 0:
            last = ((p.stderr or p.stdout).strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"bench compat: the {impl} job failed (status {p.returncode}): {last}")
        with open(out) as f:
            return json.load(f)


def drive(args) -> list[dict]:
    hvd_py = horovod_python(args)
    if hvd_py is None:
        print("bench compat: real Horovod is left out (`import horovod.torch` fails; "
              "scripts/build-horovod builds it into /tmp/hvd-venv)", file=sys.stderr)
    jobs = [("hpctrain", sys.executable)] + ([("horovod", hvd_py)] if hvd_py else [])
    per_round = []                                        # [{model: {contender: s/step}}]
    for r in range(args.rounds):
        merged: dict = {}
        for impl, py in (jobs if r % 2 == 0 else jobs[::-1]):
            for model, times in run_job(args, impl, py, r).items():
                merged.setdefault(model, {}).update(times)
        per_round.append(merged)
        print(f"bench compat: round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    return rows_from_rounds(per_round, args.batch * args.np)


def rows_from_rounds(per_round: list[dict], images_per_step: int) -> list[dict]:
    """Median images/s per (model, contender) and median paired ratios to the peers."""
    rows = []
    for model in per_round[0]:
        rates = [{c: images_per_step / s for c, s in rnd[model].items()} for rnd in per_round]
        for c in rates[0]:
            def ratio(peer, c=c, rates=rates):
                if peer not in rates[0]:
                    return None
                return statistics.median(rt[c] / rt[peer] for rt in rates)
            rows.append({"model": model, "contender": c, "images_per_s": statistics.median(rt[c] for rt in rates),
                         "rounds_images_per_s": [rt[c] for rt in rates],
                         "x_trainer": ratio(TRAINER), "x_horovod": ratio(HOROVOD)})
    return rows


def format_table(rows) -> str:
    head = f"{'model':<9} {'contender':<19} {'img/s':>8} {'x Trainer':>9} {'x Horovod':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        fmt = lambda v: f"{v:9.3f}" if v is not None else f"{'-':>9}"      # noqa: E731
        lines.append(f"{r['model']:<9} {r['contender']:<19} {r['images_per_s']:8.1f} "
                     f"{fmt(r['x_trainer'])} {fmt(r['x_horovod'])}")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="hpctrain bench compat", description=__doc__.split("\n")[0])
    add_round_args(p, DEFAULT_MODELS, NUM_CLASSES, batch=16, rounds=4, ranks_per_node=False,
                   helps={"batch": "images per rank and step", "steps": "timed steps per contender and job (median)",
                          "warmup": "untimed steps per contender and job",
                          "rounds": "rounds: one job per implementation each"})
    p.add_argument("--np", type=int, default=2, help="ranks per job")
    p.add_argument("--image-size", type=int, default=64, help="ResNet input height and width")
    p.add_argument("--fp16", action="store_true", help="fp16 gradient compression for every contender")
    p.add_argument("--horovod-python", help="the Python that imports horovod.torch")
    p.add_argument("--mpiexec", default=os.environ.get("HPCTRAIN_MPIEXEC", "mpiexec"),
                   help="the launcher ($HPCTRAIN_MPIEXEC, else mpiexec)")
    p.add_argument("--worker", choices=("hpctrain", "horovod"), help=argparse.SUPPRESS)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return check_round_args(p, p.parse_args(argv), NUM_CLASSES,
                            positive=("np", "batch", "image_size", "steps", "rounds"))


def main(argv) -> int:
    args = parse_args(argv)
    if args.worker:
        out = worker(args)
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() == 0:
            with open(args.out, "w") as f:
                json.dump(out, f)
        return 0
    rows = drive(args)
    fp16 = ", fp16 compression" if args.fp16 else ""
    print(f"compat: Horovod's synthetic benchmark, {args.np} ranks, batch {args.batch}/rank, ResNets on "
          f"{args.image_size}x{args.image_size} images, mlp on 1x8x8, SGD{fp16}; median of {args.rounds} "
          f"rounds (one job per implementation each, alternated; {OURS} and {TRAINER} step by step in "
          f"one job), median of {args.steps} steps per contender and job; 1-min load {one_minute_load():.2f}")
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0
