"""The per-step budget of ``bench step``: where a trainer's step goes, phase by phase and bucket by
bucket, beside its physical floor (:mod:`hpctrain.tools.bench.floor`).

A :class:`~hpctrain.ops.budget.PhaseBudget` takes the trainer's timer seam (``forward``,
``backward``, ``allreduce``, ``optimizer``) and the gradient sync's probe seam (``pack``,
``reduce.node``, ``reduce.inter``, ``wait``, ``unpack``, per bucket); :func:`instrument` adds
``zero_grad``, ``update`` (the update algorithm's own work) and ``check`` (the weight check after
the optimiser) on the instances, nothing in the library. Time inside a span is charged to the
innermost one, so the phases add up to the step; ``other`` is what no span covered (the
trainer's own lines around the algorithm) and is printed as the residual against the step's
wall time. The instrumented steps run after the timed rounds, so the recorder never touches the
figures of the table.
"""
from __future__ import annotations

import contextlib
import functools

from mpi4py import MPI

from hpctrain.ops.budget import NO_BUCKET, OTHER, PhaseBudget
from hpctrain.ops.timeline import Timeline, merge_and_write
from hpctrain.tools.bench.floor import floor_of
from hpctrain.update.guard import NonFiniteGuard

# Columns in the order a step runs them; the categories: compute (forward, backward),
# pack, reduction (node, inter-node), waiting, unpack, update algorithm, optimiser.
PHASES = ("zero_grad", "forward", "backward", "pack", "reduce.node", "reduce.inter", "wait", "unpack",
          "allreduce", "update", "optimizer", "check", OTHER)
COMPUTE = ("zero_grad", "forward", "backward", "optimizer")
PER_BUCKET = ("pack", "reduce.node", "reduce.inter", "wait", "unpack")
LABELS = {"allreduce": "sync glue", "update": "update algo", OTHER: "other"}


def _spanned(budget: PhaseBudget, name: str, fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with budget.span(name):
            return fn(*args, **kwargs)
    return wrapped


class _TimedGuard(NonFiniteGuard):
    """The algorithm's guard with its weight check charged to ``check`` (the guard is slotted:
    its method cannot be wrapped on the instance)."""
    __slots__ = ("budget",)
    budget: PhaseBudget

    def applied(self, step: int, params, grads_checked: bool = True) -> None:
        with self.budget.span("check"):
            super().applied(step, params, grads_checked)


def _move_state(src: NonFiniteGuard, dst: NonFiniteGuard) -> None:
    for slot in NonFiniteGuard.__slots__:
        setattr(dst, slot, getattr(src, slot))


@contextlib.contextmanager
def instrument(trainer, optimizer, budget: PhaseBudget):
    """Route ``trainer``'s (a DistributedTrainer) time into ``budget`` while inside; afterwards
    the trainer is as it was (its null timer and probe, its own methods and guard)."""
    algo, sync = trainer.algo, trainer.grad_sync
    saved_timer, saved_probe, guard = algo.timer, sync.probe, algo.guard
    try:
        algo.timer, sync.probe = budget, budget
        optimizer.zero_grad = _spanned(budget, "zero_grad", optimizer.zero_grad)
        algo.step = _spanned(budget, "update", algo.step)
        if guard is not None:
            timed = _TimedGuard.__new__(_TimedGuard)
            _move_state(guard, timed)
            timed.budget = budget
            algo.guard = timed
        yield budget
    finally:
        algo.timer, sync.probe = saved_timer, saved_probe
        for obj, attr in ((optimizer, "zero_grad"), (algo, "step")):
            obj.__dict__.pop(attr, None)
        if guard is not None:
            _move_state(algo.guard, guard)
            algo.guard = guard


def per_step(totals: dict, steps: int) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """``(phase, bucket) -> seconds`` over ``steps`` steps into seconds per step by phase, and
    by bucket the per-bucket phases."""
    phases: dict[str, float] = {}
    buckets: dict[int, dict[str, float]] = {}
    for (name, bucket), seconds in totals.items():
        phases[name] = phases.get(name, 0.0) + seconds / steps
        if bucket != NO_BUCKET:
            row = buckets.setdefault(bucket, {})
            row[name] = row.get(name, 0.0) + seconds / steps
    return phases, buckets


def measure_budget(comm: MPI.Comm, trainer, optimizer, data, steps: int, trace: str | None = None) -> dict:
    """Run ``steps`` instrumented steps; every rank's mean per step (ms) of each phase, of each
    bucket's phases, of the wall time, and the floor (collective). ``trace``: also write every
    span of every rank to this Chrome trace (:mod:`hpctrain.ops.timeline`; buckets as ``pack[0]``)."""
    x, y = data
    timeline = Timeline(comm) if trace else None
    budget = PhaseBudget(sinks=[timeline] if timeline is not None else ())
    walls = []
    with instrument(trainer, optimizer, budget):
        comm.Barrier()
        budget.reset()
        for _ in range(steps):
            walls.append(budget.step(lambda: trainer.step(x, y)))
        totals = budget.reset()
    if timeline is not None and trace:
        merge_and_write(timeline, comm, trace)
    phases, buckets = per_step(totals, steps)
    size = comm.Get_size()
    mean = _mean_over_ranks(comm, phases)
    bucket_mean = _mean_over_ranks(comm, {(i, k): v for i, row in buckets.items() for k, v in row.items()})
    wall = comm.allreduce(sum(walls) / steps, op=MPI.SUM) / size
    compute_s = sum(mean.get(k, 0.0) for k in COMPUTE)
    floor = floor_of(trainer.grad_sync, compute_s)
    by_bucket: dict[int, dict[str, float]] = {}
    for (i, k), v in bucket_mean.items():
        by_bucket.setdefault(i, {})[k] = v * 1e3
    named = sum(v for k, v in mean.items() if k != OTHER)
    return {"phases_ms": {k: v * 1e3 for k, v in mean.items()}, "buckets_ms": by_bucket,
            "step_ms": wall * 1e3, "sum_ms": named * 1e3, "residual_ms": (wall - named) * 1e3,
            "residual_pct": 100.0 * (wall - named) / wall if wall else 0.0, "steps": steps, "floor": floor}


def _mean_over_ranks(comm: MPI.Comm, values: dict) -> dict:
    """The mean over ranks of each key's value (a key a rank lacks counts 0 there)."""
    out: dict = {}
    for d in comm.allgather(values):
        for k, v in d.items():
            out[k] = out.get(k, 0.0) + v / comm.Get_size()
    return out


def format_budget(rows) -> str:
    """Per (model, config) with a budget: ms per step by phase, the sum against the instrumented
    steps' wall time (``resid%``: what no phase claims), the rounds' median without the recorder
    (``timed``: what the instrumented steps should resemble), the floor and its parts; then the
    per-bucket phases."""
    lines = []
    cols = [p for p in PHASES if any(p in r["budget"]["phases_ms"] for r in rows if r.get("budget"))]
    head = f"{'model':<11} {'config':<22} " + " ".join(f"{LABELS.get(c, c):>12}" for c in cols) + \
        f" {'sum':>8} {'step':>8} {'resid%':>7} {'timed':>8} {'floor':>8} {'x floor':>7}"
    lines += ["budget (ms/step, mean over ranks; exclusive time, innermost span)", head, "-" * len(head)]
    for r in rows:
        b = r.get("budget")
        if not b:
            continue
        f = b["floor"]
        lines.append(f"{r['model']:<11} {r['config']:<22} "
                     + " ".join(f"{b['phases_ms'].get(c, 0.0):12.2f}" for c in cols)
                     + f" {b['sum_ms']:8.2f} {b['step_ms']:8.2f} {b['residual_pct']:7.1f} {r['step_ms']:8.2f} "
                     f"{f['floor_ms']:8.2f} "
                     f"{f['floor_ms'] / b['step_ms'] if b['step_ms'] else 0.0:7.2f}")
    lines += ["", "floor = compute (zero_grad+forward+backward+optimizer) + bytes moved / copy rate + syncs x latency"]
    for r in rows:
        b = r.get("budget")
        if not b:
            continue
        f = b["floor"]
        lines.append(f"{r['model']:<11} {r['config']:<22} compute {f['compute_ms']:.2f} + "
                     f"{f['bytes_moved'] / 2**20:.1f} MiB at {f['copy_GBps']:.2f} GB/s {f['transfer_ms']:.2f} + "
                     f"{f['syncs']} x {f['sync_latency_us']:.1f} us {f['sync_ms']:.2f} = {f['floor_ms']:.2f} ms "
                     f"(gradients {f['gradient_bytes'] / 2**20:.1f} MiB; network: {f['network']})")
    lines += ["", "per bucket (ms/step): " + ", ".join(PER_BUCKET)]
    for r in rows:
        b = r.get("budget")
        for i, row in sorted((b or {}).get("buckets_ms", {}).items()):
            lines.append(f"{r['model']:<11} {r['config']:<22} bucket {i}: "
                         + " ".join(f"{row.get(c, 0.0):8.2f}" for c in PER_BUCKET))
    return "\n".join(lines)
