"""``python -m hpctrain study large-batch``: do the large-batch techniques do what the papers claim?
(``study held-out``: the same question on generated data nobody tuned for, ``bench/held_out.py``.)

Trains the same model for the same number of epochs as
  (i)   small-batch baseline, plain SGD;
  (ii)  K× larger batch, SGD with the linear scaling rule, no warmup;
  (iii) the same with gradual warmup (Goyal et al. 2017);
  (iv)  LARS with warmup and polynomial decay (You et al.; the MLPerf recipe);
and a Final Polishing on/off pair with training augmentation on. Prints a table of final test
accuracies, writes ``study.json`` and ``study.png`` (test accuracy per epoch) in ``--out``.
Runs under ``mpiexec`` like training: the global batch is split over the ranks.
"""
from __future__ import annotations

import argparse
import json
import os

from hpctrain.job.config import Config, load_toml, set_value
from hpctrain.tools.bench.variant import run_variant


def variants(base_batch: int, factor: int, lr: float, lars_lr: float, warmup: float) -> list[tuple[str, dict]]:
    big = base_batch * factor
    common = {"optim.schedule": "cosine", "optim.base_batch": base_batch, "optim.lr": lr}
    return [
        ("(i) small batch SGD", {**common, "train.batch_size": base_batch, "optim.warmup": "none"}),
        ("(ii) large batch SGD, linear scaling", {**common, "train.batch_size": big, "optim.warmup": "none"}),
        ("(iii) + warmup", {**common, "train.batch_size": big, "optim.warmup": "linear",
                            "optim.warmup_epochs": warmup}),
        ("(iv) LARS + warmup + poly", {"train.batch_size": big, "optim.name": "lars", "optim.schedule": "poly",
                                       "optim.scale_lr": False, "optim.lr": lars_lr, "optim.warmup": "linear",
                                       "optim.warmup_epochs": warmup, "optim.weight_decay": 5e-5}),
    ]


def polish_variants(batch: int, lr: float) -> list[tuple[str, dict]]:
    common = {"train.batch_size": batch, "optim.lr": lr, "data.augment": True}
    return [("polish off (augmented)", {**common, "polish.bn_recompute": False}),
            ("polish on (augmented)", {**common, "polish.bn_recompute": True})]


def plot(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ax.plot(range(1, len(r["curve"]) + 1), [100 * a for a in r["curve"]],
                label=f"{r['name']} (B={r['global_batch']})")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("large-batch study")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(rows: list[dict]) -> str:
    base = rows[0]["test_accuracy"]
    lines = [f"{'variant':<40} {'batch':>6} {'steps':>6} {'test acc %':>10} {'vs (i)':>8}"]
    for r in rows:
        lines.append(f"{r['name']:<40} {r['global_batch']:>6} {r['steps']:>6} {100 * r['test_accuracy']:>10.2f} "
                     f"{100 * (r['test_accuracy'] - base):>+8.2f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpctrain study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", choices=["large-batch", "held-out"])
    ap.add_argument("--config", help="TOML base config (dataset, model, …); large-batch only")
    ap.add_argument("--epochs", type=int, default=None, help="default: 30 for large-batch, 90 for held-out "
                    "(its 32x runs need the steps: docs/large-batch.md)")
    ap.add_argument("--batch", type=int, default=None, help="small (baseline) global batch (default: 16 for "
                    "large-batch, 64 for held-out)")
    ap.add_argument("--factor", type=int, default=32, help="large batch = batch × factor")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD lr at the small batch")
    ap.add_argument("--lars-lr", type=float, default=4.0, help="LARS peak lr (unscaled)")
    ap.add_argument("--warmup-epochs", type=float, default=5.0)
    ap.add_argument("--no-polish", action="store_true", help="skip the Final Polishing pair")
    ap.add_argument("--out", default="runs/study", help="output directory")
    ap.add_argument("--datasets", default="signal1d,tabular,spirals", help="held-out: comma-separated generated "
                    "datasets")
    ap.add_argument("--seeds", type=int, default=3, help="held-out: seeds 0..N-1 per variant")
    ap.add_argument("--ablation", action="store_true", help="held-out: add LARS as given (MLPerf eta, raw 1-D lr)")
    ap.add_argument("--small-lamb", action="store_true", help="held-out: add LAMB at the small batch (recipe "
                    "auto), to tell LAMB's own gap to SGD from the large batch's")
    ap.add_argument("--cache-dir", default=None, help="held-out: where the generated datasets are converted")
    args = ap.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if args.study == "held-out":
        from hpctrain.tools.bench import held_out  # its own dependencies load only when it runs
        args.batch, args.epochs = args.batch or 64, args.epochs or 90
        return held_out.main(args, comm)
    args.batch, args.epochs = args.batch or 16, args.epochs or 30
    base = Config()
    if args.config:
        load_toml(base, args.config)
    set_value(base, "train.epochs", args.epochs)
    rows = [run_variant(base, n, o, args.out, comm)
            for n, o in variants(args.batch, args.factor, args.lr, args.lars_lr, args.warmup_epochs)]
    if not args.no_polish:
        rows += [run_variant(base, n, o, args.out, comm) for n, o in polish_variants(args.batch * 4, args.lr)]
    if comm.Get_rank() == 0:
        print(table(rows))
        with open(os.path.join(args.out, "study.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
        plot(rows, os.path.join(args.out, "study.png"))
        print(f"wrote {args.out}/study.json and {args.out}/study.png")
    return 0
