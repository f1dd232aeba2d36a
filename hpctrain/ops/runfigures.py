"""A run's records read back (``RUN_DIR/metrics.jsonl``) and the figures computed from them.

Pure functions of the records: throughput per epoch, the time per phase, the data wait, the
scaling against a baseline run; :mod:`report` prints them and :mod:`reportplots` draws them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from hpctrain.errors import UserError

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
