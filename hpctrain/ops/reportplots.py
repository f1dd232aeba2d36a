"""The report's PNGs (matplotlib, Agg): loss, accuracy, learning rate, throughput, phases.

One function per figure, each drawing a run and its baseline (dashed) on one axis; :func:`plot`
writes them all, each file whole or absent.
"""
from __future__ import annotations

import os

from hpctrain.ops.fileio import atomic_open, why
from hpctrain.ops.runfigures import PHASE_ORDER, ReportError, Run, epoch_samples_per_s, phase_breakdown


def _series(run: Run, key: str):
    pts = [(e["epoch"] + 1, e[key]) for e in run.epochs if e.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


class _Figures:
    """Where the PNGs go, the runs they draw (the run solid, its baseline dashed), and what was written."""

    def __init__(self, plt, run: Run, baseline: Run | None, out_dir: str):
        self.plt, self.run, self.baseline, self.out_dir = plt, run, baseline, out_dir
        self.runs = [(run, "-", "C0")] + ([(baseline, "--", "C1")] if baseline else [])
        self.paths: list[str] = []

    def new(self, height: float = 4):
        return self.plt.subplots(figsize=(6.4, height))

    def save(self, fig, ax, name, title, ylabel, xlabel="epoch") -> None:
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        fig.tight_layout()
        path = os.path.join(self.out_dir, name)
        try:
            with atomic_open(path, "wb") as fh:      # whole or absent, never through a link
                fig.savefig(fh, dpi=110, format="png")
        except OSError as exc:
            raise ReportError(why(exc, path)) from None
        self.plt.close(fig)
        self.paths.append(path)


def _loss(f: _Figures) -> None:
    fig, ax = f.new()
    for r, ls, c in f.runs:
        x, y = _series(r, "train_loss")
        ax.plot(x, y, ls, color=c, marker="o", ms=3, label=f"train, {r.label}")
        x, y = _series(r, "test_loss")
        if x:
            ax.plot(x, y, ls, color=c, marker="s", ms=3, alpha=0.6, label=f"test, {r.label}")
    ax.set_yscale("log")
    f.save(fig, ax, "loss.png", "Loss", "cross-entropy (log scale)")


def _accuracy(f: _Figures) -> None:
    fig, ax = f.new()
    for r, ls, c in f.runs:
        x, y = _series(r, "test_accuracy")
        last = r.epochs[-1]["epoch"] + 1 if r.epochs else 0
        if r.summary and r.summary.get("test_accuracy") is not None and (not x or x[-1] != last):
            x, y = x + [last], y + [r.summary["test_accuracy"]]    # the end-of-training evaluation
        ax.plot(x, [100 * v for v in y], ls, color=c, marker="o", ms=4, label=r.label)
    f.save(fig, ax, "accuracy.png", "Test accuracy", "accuracy (%)")


def _lr(f: _Figures) -> None:
    fig, ax = f.new()
    for r, ls, c in f.runs:
        x, y = _series(r, "lr")
        ax.plot(x, y, ls, color=c, marker="o", ms=3, label=r.label)
    f.save(fig, ax, "lr.png", "Learning rate at the end of each epoch", "learning rate")


def _throughput(f: _Figures) -> None:
    fig, ax = f.new()
    for r, ls, c in f.runs:
        sps = epoch_samples_per_s(r)
        ax.plot([e["epoch"] + 1 for e in r.epochs], sps, ls, color=c, marker="o", ms=3, label=r.label)
    base = f.baseline
    if base and base.summary:
        ideal = base.summary["samples_per_s"] * f.run.world_size / base.world_size
        ax.axhline(ideal, color="grey", ls=":", label=f"linear scaling from the baseline ({ideal:,.0f})")
    ax.set_ylim(bottom=0)
    f.save(fig, ax, "throughput.png", "Training throughput per epoch", "samples/s")


def _phases(f: _Figures) -> None:
    fig, ax = f.new(1.6 + 0.9 * len(f.runs))
    for i, (r, _, _) in enumerate(f.runs):
        phases = phase_breakdown(r)
        steps = max((r.summary or {}).get("steps", 0) - (r.summary or {}).get("start_step", 0), 1)
        left = 0.0
        order = [k for k in PHASE_ORDER if k in phases] + sorted(set(phases) - set(PHASE_ORDER))
        for j, k in enumerate(order):
            ms = 1000 * phases[k] / steps
            ax.barh(i, ms, left=left, color=f"C{j}", label=k if i == 0 else None)
            left += ms
    ax.set_yticks(range(len(f.runs)), [r.label for r, _, _ in f.runs])
    ax.invert_yaxis()
    f.save(fig, ax, "phases.png", "Time per step by phase", "", xlabel="ms per step (mean over the run)")


def plot(run: Run, baseline: Run | None, out_dir: str) -> list[str]:
    """Write the PNGs; returns their paths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ReportError(f"plots need matplotlib (pip install matplotlib): {exc}") from None
    os.makedirs(out_dir, exist_ok=True)
    f = _Figures(plt, run, baseline, out_dir)
    for draw in (_loss, _accuracy, _lr, _throughput, _phases):
        draw(f)
    return f.paths
