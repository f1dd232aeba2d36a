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

from hpctrain.ops.reportplots import plot
from hpctrain.ops.runfigures import (
    PHASE_ORDER,
    ReportError,
    Run,
    data_wait,
    epoch_samples_per_s,
    figures,
    load_run,
    phase_breakdown,
    scaling,
)

__all__ = ["PHASE_ORDER", "ReportError", "Run", "data_wait", "epoch_samples_per_s", "figures", "format_report",
           "load_run", "main", "phase_breakdown", "plot", "scaling"]

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
