"""``python -m hpctrain report RUN_DIR [--baseline RUN_DIR_1RANK]``: figures and plots of a run.

Reads ``RUN_DIR/metrics.jsonl`` and prints throughput, the time breakdown per phase, GPU-hours
and seed 000's "actual average single-GPU training time" (wall × ranks / epochs, docs/operations.md);
with ``--baseline`` (a run of the same config on fewer ranks, normally 1) also the speed-up and
the scaling efficiency, speed-up / (ranks / baseline ranks). Writes matplotlib (Agg) PNGs to
``RUN_DIR/report/``: loss, accuracy, learning rate, samples/s and the phase breakdown.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field

from hpctrain.errors import UserError
from hpctrain.ops.fileio import atomic_open, why

PHASE_ORDER = ["data", "forward", "backward", "allreduce", "optimizer", "checkpoint", "polish"]


class ReportError(UserError):
    """The run directory cannot be read (one line)."""


@dataclass
class Run:
    path: str
    config: dict = field(default_factory=dict)   # the first "config" record
    epochs: list = field(default_factory=list)   # "epoch" records, one per epoch (a resumed epoch: last wins)
    summary: dict | None = None
    stopped: dict | None = None
    warnings: list = field(default_factory=list)   # "warning" records (input is the bottleneck)
    skipped: str | None = None                   # lines not read (a write cut short), said once

    @property
    def world_size(self) -> int:
        return int((self.summary or {}).get("world_size") or self.config.get("world_size") or 1)

    @property
    def global_batch(self) -> int:
        return int((self.summary or {}).get("global_batch") or self.config["config"]["train"]["batch_size"])

    @property
    def label(self) -> str:
        return f"{os.path.basename(os.path.normpath(self.path))} ({self.world_size} rank{'s' * (self.world_size > 1)})"


def load_run(path: str) -> Run:
    metrics = os.path.join(path, "metrics.jsonl")
    recs, bad = [], []
    try:
        with open(metrics, errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                try:
                    rec = json.loads(line) if line.strip() else None
                except ValueError:
                    rec = "bad"
                if isinstance(rec, dict):
                    recs.append(rec)
                elif rec is not None:
                    bad.append(n)
    except FileNotFoundError:
        raise ReportError(f"{metrics}: not found (is {path} a run directory?)") from None
    except OSError as exc:
        raise ReportError(f"{metrics}: {exc.strerror or exc}") from None
    if bad and not recs:
        raise ReportError(f"{metrics}: not JSON lines (line {bad[0]})")
    run = Run(path)
    if bad:
        run.skipped = (f"{metrics}: skipped {len(bad)} line(s) that are not a JSON record (line "
                       f"{', '.join(map(str, bad[:3]))}{'…' if len(bad) > 3 else ''}: a write cut short)")
    by_epoch = {}
    for r in recs:
        kind = r.get("event")
        if kind == "config" and not run.config:
            run.config = r
        elif kind == "epoch":
            by_epoch[r["epoch"]] = r
        elif kind == "summary":
            run.summary, run.stopped = r, None
        elif kind == "stopped":
            run.stopped = r
        elif kind == "warning":
            run.warnings.append(r)
    if not run.config:
        raise ReportError(f"{metrics}: no config record")
    run.epochs = [by_epoch[e] for e in sorted(by_epoch)]
    return run


# --- figures (pure functions of the records) -----------------------------------------------------

def epoch_samples_per_s(run: Run) -> list[float]:
    """Per epoch: global batch × steps taken in the epoch / epoch wall time."""
    out, prev = [], run.config.get("start_step") or 0
    for e in run.epochs:
        out.append((e["step"] - prev) * run.global_batch / e["epoch_s"] if e["epoch_s"] else 0.0)
        prev = e["step"]
    return out


def phase_breakdown(run: Run) -> dict[str, float]:
    """Seconds per phase over the run (summary, or the sum of the epochs of a stopped run)."""
    if run.summary and run.summary.get("phases_s"):
        return dict(run.summary["phases_s"])
    total: dict[str, float] = {}
    for e in run.epochs:
        for k, v in e.get("phases_s", {}).items():
            total[k] = total.get(k, 0.0) + v
    return total


def data_wait(run: Run) -> dict | None:
    """The epochs' data-wait shares (highest over ranks, :mod:`hpctrain.ops.datawait`): mean, the
    worst epoch and its rank, and the run's input-bound warning if it had one (judged without the
    first batch's warm-up, which the shares include); None for runs recorded before them."""
    rows = [e for e in run.epochs if e.get("data_wait_share_max") is not None]
    if not rows:
        return None
    worst = max(rows, key=lambda e: e["data_wait_share_max"])
    return {"mean": sum(e["data_wait_share_max"] for e in rows) / len(rows), "max": worst["data_wait_share_max"],
            "epoch": worst["epoch"], "rank": worst.get("data_wait_rank", 0),
            "warning": run.warnings[0]["message"] if run.warnings else None}


def scaling(samples_per_s: float, world: int, base_samples_per_s: float, base_world: int) -> dict:
    """Speed-up over the baseline and the scaling efficiency (1.0 = linear)."""
    speedup = samples_per_s / base_samples_per_s
    ideal = world / base_world
    return {"speedup": speedup, "ideal_speedup": ideal, "scaling_efficiency": speedup / ideal}


def figures(run: Run, baseline: Run | None = None) -> dict:
    s = run.summary or {}
    out = {"run": run.label, "world_size": run.world_size, "global_batch": run.global_batch,
           "steps": s.get("steps", run.epochs[-1]["step"] if run.epochs else 0),
           "epochs": s.get("epochs"), "test_accuracy": s.get("test_accuracy"),
           "samples_per_s": s.get("samples_per_s"), "wall_s": s.get("wall_s"), "train_s": s.get("train_s"),
           "gpu_time_s": s.get("gpu_time_s"),
           "avg_single_gpu_time_per_epoch_s": s.get("avg_single_gpu_time_per_epoch_s"),
           "stopped": run.stopped}
    if out["gpu_time_s"] is not None:
        out["gpu_hours"] = out["gpu_time_s"] / 3600
    out["data_wait"] = data_wait(run)
    phases = phase_breakdown(run)
    total = sum(phases.values())
    out["phase_share"] = {k: v / total for k, v in phases.items()} if total else {}
    if baseline is not None and baseline.summary and s.get("samples_per_s"):
        out.update(scaling(s["samples_per_s"], run.world_size, baseline.summary["samples_per_s"], baseline.world_size))
        out["baseline"] = baseline.label
        b = baseline.summary.get("avg_single_gpu_time_per_epoch_s")
        if b and out["avg_single_gpu_time_per_epoch_s"]:
            out["gpu_time_ratio"] = out["avg_single_gpu_time_per_epoch_s"] / b
    return out


def format_report(f: dict) -> str:
    def num(key, fmt, unit=""):
        v = f.get(key)
        return "n/a" if v is None else fmt.format(v) + unit
    lines = [f"run                     {f['run']}, global batch {f['global_batch']}",
             f"steps / epochs          {f['steps']} / {num('epochs', '{:.2f}')}"]
    if f["stopped"]:
        lines.append(f"stopped                 by {f['stopped']['signal']} at step {f['stopped']['step']} "
                     f"(checkpoint {f['stopped']['checkpoint']})")
    lines += [f"test accuracy           {num('test_accuracy', '{:.2%}')}",
              f"throughput              {num('samples_per_s', '{:,.0f}', ' samples/s')}",
              f"wall / train time       {num('wall_s', '{:.1f}', ' s')} / {num('train_s', '{:.1f}', ' s')}",
              f"GPU time                {num('gpu_time_s', '{:.1f}', ' s')} = "
              f"{num('gpu_hours', '{:.4f}', ' GPU-hours')}",
              f"avg single-GPU time     {num('avg_single_gpu_time_per_epoch_s', '{:.2f}', ' s per epoch')}"
              "  (wall x ranks / epochs; lower is better)"]
    if "speedup" in f:
        lines += [f"baseline                {f['baseline']}",
                  f"speed-up                {f['speedup']:.2f}x of an ideal {f['ideal_speedup']:.2f}x",
                  f"scaling efficiency      {f['scaling_efficiency']:.1%}"]
        if "gpu_time_ratio" in f:
            lines.append(f"single-GPU time ratio   {f['gpu_time_ratio']:.2f}x the baseline's")
    w = f.get("data_wait")
    if w:
        lines.append(f"data wait per epoch     mean {w['mean']:.1%}, highest {w['max']:.1%} (epoch {w['epoch']}, "
                     f"rank {w['rank']})")
        if w["warning"]:
            lines.append(f"input-bound             {w['warning'].split('warning: ', 1)[-1]}")
    if f["phase_share"]:
        order = [k for k in PHASE_ORDER if k in f["phase_share"]] + sorted(set(f["phase_share"]) - set(PHASE_ORDER))
        lines.append("time per phase          " + ", ".join(f"{k} {f['phase_share'][k]:.1%}" for k in order))
    return "\n".join(lines)


# --- plots ----------------------------------------------------------------------------------------

def _series(run: Run, key: str):
    pts = [(e["epoch"] + 1, e[key]) for e in run.epochs if e.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(run: Run, baseline: Run | None, out_dir: str) -> list[str]:
    """Write the PNGs; returns their paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ReportError(f"plots need matplotlib (pip install matplotlib): {exc}") from None
    os.makedirs(out_dir, exist_ok=True)
    runs = [(run, "-", "C0")] + ([(baseline, "--", "C1")] if baseline else [])
    paths = []

    def save(fig, ax, name, title, ylabel, xlabel="epoch"):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        try:
            with atomic_open(path, "wb") as fh:      # whole or absent, never through a link
                fig.savefig(fh, dpi=110, format="png")
        except OSError as exc:
            raise ReportError(why(exc, path)) from None
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for r, ls, c in runs:
        x, y = _series(r, "train_loss")
        ax.plot(x, y, ls, color=c, marker="o", ms=3, label=f"train, {r.label}")
        x, y = _series(r, "test_loss")
        if x:
            ax.plot(x, y, ls, color=c, marker="s", ms=3, alpha=0.6, label=f"test, {r.label}")
    ax.set_yscale("log")
    save(fig, ax, "loss.png", "Loss", "cross-entropy (log scale)")

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for r, ls, c in runs:
        x, y = _series(r, "test_accuracy")
        last = r.epochs[-1]["epoch"] + 1 if r.epochs else 0
        if r.summary and r.summary.get("test_accuracy") is not None and (not x or x[-1] != last):
            x, y = x + [last], y + [r.summary["test_accuracy"]]    # the end-of-training evaluation
        ax.plot(x, [100 * v for v in y], ls, color=c, marker="o", ms=4, label=r.label)
    save(fig, ax, "accuracy.png", "Test accuracy", "accuracy (%)")

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for r, ls, c in runs:
        x, y = _series(r, "lr")
        ax.plot(x, y, ls, color=c, marker="o", ms=3, label=r.label)
    save(fig, ax, "lr.png", "Learning rate at the end of each epoch", "learning rate")

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for r, ls, c in runs:
        sps = epoch_samples_per_s(r)
        ax.plot([e["epoch"] + 1 for e in r.epochs], sps, ls, color=c, marker="o", ms=3, label=r.label)
    if baseline and baseline.summary:
        ideal = baseline.summary["samples_per_s"] * run.world_size / baseline.world_size
        ax.axhline(ideal, color="grey", ls=":", label=f"linear scaling from the baseline ({ideal:,.0f})")
    ax.set_ylim(bottom=0)
    save(fig, ax, "throughput.png", "Training throughput per epoch", "samples/s")

    fig, ax = plt.subplots(figsize=(6.4, 1.6 + 0.9 * len(runs)))
    for i, (r, _, _) in enumerate(runs):
        phases = phase_breakdown(r)
        steps = max((r.summary or {}).get("steps", 0) - (r.summary or {}).get("start_step", 0), 1)
        left = 0.0
        order = [k for k in PHASE_ORDER if k in phases] + sorted(set(phases) - set(PHASE_ORDER))
        for j, k in enumerate(order):
            ms = 1000 * phases[k] / steps
            ax.barh(i, ms, left=left, color=f"C{j}", label=k if i == 0 else None)
            left += ms
    ax.set_yticks(range(len(runs)), [r.label for r, _, _ in runs])
    ax.invert_yaxis()
    save(fig, ax, "phases.png", "Time per step by phase", "", xlabel="ms per step (mean over the run)")
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpctrain report", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run directory (with metrics.jsonl)")
    ap.add_argument("--baseline", metavar="RUN_DIR", help="run of the same config on fewer ranks (normally 1)")
    ap.add_argument("--out", metavar="DIR", help="where the PNGs go (default RUN_DIR/report)")
    ap.add_argument("--no-plots", action="store_true", help="print only")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON instead of text")
    args = ap.parse_args(argv)
    try:
        run = load_run(args.run_dir)
        baseline = load_run(args.baseline) if args.baseline else None
        for r in (run, baseline):
            if r is not None and r.skipped:
                print(f"hpctrain report: warning: {r.skipped}", file=sys.stderr)
        f = figures(run, baseline)
        print(json.dumps(f, indent=1) if args.json else format_report(f))
        if not args.no_plots:
            paths = plot(run, baseline, args.out or os.path.join(args.run_dir, "report"))
            if not args.json:
                print(f"plots: {', '.join(paths)}")
    except ReportError as exc:
        print(f"hpctrain report: error: {exc}", file=sys.stderr)
        return 2
    return 0
