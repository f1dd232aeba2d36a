"""Output of the simulator: fixed-width tables, JSON, and a matplotlib PNG (Agg backend)."""
from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = ["SCALING_COLUMNS", "VALIDATION_COLUMNS", "format_table", "write_json", "plot_scaling"]

# (key, header, format)
SCALING_COLUMNS = [
    ("gpus", "GPUs", "{:d}"), ("nodes", "nodes", "{:d}"), ("step_ms", "step ms", "{:.1f}"),
    ("comm_ms", "comm ms", "{:.1f}"), ("exposed_comm_ms", "exposed ms", "{:.1f}"),
    ("images_per_s", "images/s", "{:,.0f}"), ("efficiency_pct", "eff %", "{:.1f}"),
    ("time_to_train_h", "train h", "{:.3g}"), ("gpu_h_per_epoch", "GPU·h/epoch", "{:.3g}"),
]
VALIDATION_COLUMNS = [
    ("case", "case", "{}"), ("gpus", "GPUs", "{:d}"), ("baseline_gpus", "vs", "{:d}"),
    ("published_pct", "published %", "{:.1f}"), ("predicted_pct", "predicted %", "{:.1f}"),
    ("error_pts", "error pts", "{:.1f}"), ("exposed_comm_ms", "exposed ms", "{:.1f}"),
]


def format_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    """Right-aligned text table (first column left-aligned), one line per row."""
    cells = [[fmt.format(r[key]) for key, _, fmt in columns] for r in rows]
    heads = [head for _, head, _ in columns]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(heads)]

    def line(vals: list[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                         for i, (v, w) in enumerate(zip(vals, widths))).rstrip()

    return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(c) for c in cells])


def write_json(path: str, payload: dict) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=str)
        f.write("\n")


def plot_scaling(path: str, rows: Sequence[dict], title: str) -> None:
    """images/s against GPUs (log-log, with the ideal line) and scaling efficiency."""
    try:
        import matplotlib
    except ImportError as e:  # matplotlib is a core dependency in setup.cfg
        raise ImportError("--plot needs matplotlib: pip install 'matplotlib>=3.8'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = [r["gpus"] for r in rows]
    ips = [r["images_per_s"] for r in rows]
    ideal = [ips[0] / gpus[0] * g for g in gpus]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.loglog(gpus, ideal, "k--", label="ideal", base=2)
    ax1.loglog(gpus, ips, "o-", label="predicted", base=2)
    ax1.set_xlabel("GPUs")
    ax1.set_ylabel("images/s")
    ax1.legend()
    ax2.semilogx(gpus, [r["efficiency_pct"] for r in rows], "o-", base=2)
    ax2.set_xlabel("GPUs")
    ax2.set_ylabel("scaling efficiency %")
    ax2.set_ylim(0, 105)
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
