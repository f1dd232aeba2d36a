"""``python -m hpctrain simulate``: predicted step time, images/s, scaling efficiency and time to
train of data-parallel SGD on 1 … nodes × gpus-per-node GPUs, from an α-β-γ model of allreduce.

    python -m hpctrain simulate --nodes 128 --gpus-per-node 4 --model resnet50 --device v100 \
        --net ib-edr --algo hierarchical --plot scaling.png --json scaling.json
    python -m hpctrain bench allreduce --json bench.json   # then fit α, β to this machine:
    python -m hpctrain simulate --calibrate bench.json --calib-impl flat --nodes 64 --device cpu
    python -m hpctrain simulate --validate                 # vs Kasagi, Horovod, Goyal

The model lives in :mod:`hpctrain.tools.sim` (costs: allreduce formulas; presets: sourced figures;
step: overlap, loading, stragglers, scaling table; calibrate: least-squares α, β; validate:
published cases). Assumptions, stated once:
- compute per GPU is a published single-device throughput (or ``--step-time-s``), independent of
  the GPU count; backward = 2/3 of it; gradients are produced uniformly over backward;
- buckets are reduced one at a time, overlapped with backward unless ``--no-overlap``;
- networks achieve ``LINK_EFFICIENCY`` (0.9) of their signalling rate, the same for all;
- every rank of a node shares the node's NICs; no congestion or topology beyond that;
- no straggler cost unless ``--straggler-cv`` is given (then the same for every case).
"""
from __future__ import annotations

import argparse
from dataclasses import asdict, replace

from hpctrain.tools.sim.calibrate import fit_alpha_beta, load_rows, select_rows
from hpctrain.tools.sim.costs import ALGORITHMS
from hpctrain.tools.sim.presets import DEVICES, INTRA, MODELS, NETWORKS
from hpctrain.tools.sim.report import SCALING_COLUMNS, VALIDATION_COLUMNS, format_table, plot_scaling, write_json
from hpctrain.tools.sim.step import (
    IMAGENET_TRAIN_IMAGES,
    Scenario,
    compute_time_s,
    gpu_counts,
    scaling_table,
    scenario_links,
)
from hpctrain.tools.sim.validate import NCCL_NET_HOP_ALPHA_S, nccl_latency_variant, validation_rows

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m hpctrain simulate", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = ap.add_argument_group("cluster")
    g.add_argument("--nodes", type=int, default=1024)
    g.add_argument("--gpus-per-node", type=int, default=4)
    g.add_argument("--net", choices=sorted(NETWORKS), default="ib-edr")
    g.add_argument("--intra", choices=sorted(INTRA), default="nvlink-v100")
    g.add_argument("--nics-per-node", type=int, default=1)
    g.add_argument("--inter-alpha-us", type=float, help="override the network's latency α [µs]")
    g.add_argument("--intra-alpha-us", type=float, help="override the intra-node latency α [µs]")
    g = ap.add_argument_group("workload")
    g.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    g.add_argument("--device", choices=sorted(DEVICES), default="v100")
    g.add_argument("--precision", choices=["amp", "fp32"], default="amp")
    g.add_argument("--batch-per-gpu", type=int, help="default: the batch of the device's figure")
    g.add_argument("--step-time-s", type=float, help="measured one-GPU step for --batch-per-gpu")
    g.add_argument("--params-m", type=float, help="override the model's parameters [millions]")
    g.add_argument("--loader-img-s", type=float, default=0.0,
                   help="input pipeline images/s per GPU (0: never the bottleneck)")
    g.add_argument("--epochs", type=float, default=90)
    g.add_argument("--dataset-size", type=int, default=IMAGENET_TRAIN_IMAGES)
    g = ap.add_argument_group("communication")
    g.add_argument("--algo", choices=["hierarchical", *ALGORITHMS], default="hierarchical")
    g.add_argument("--inter-algo", choices=sorted(ALGORITHMS), default="ring")
    g.add_argument("--compression", choices=["none", "fp16"], default="none")
    g.add_argument("--bucket-mb", type=float, default=25.0)
    g.add_argument("--no-overlap", action="store_true", help="all buckets after backward")
    g.add_argument("--straggler-cv", type=float, default=0.0,
                   help="coefficient of variation of per-step compute time")
    g = ap.add_argument_group("output")
    g.add_argument("--baseline-gpus", type=int, default=1, help="efficiency relative to this count")
    g.add_argument("--plot", metavar="FILE.png")
    g.add_argument("--json", metavar="FILE")
    g.add_argument("--validate", action="store_true", help="predicted vs published efficiency")
    g = ap.add_argument_group("calibration")
    g.add_argument("--calibrate", metavar="FILE.json", help="rows of `hpctrain bench allreduce --json`")
    g.add_argument("--calib-impl", default="flat", help="impl whose rows are fitted")
    g.add_argument("--calib-compression", choices=["none", "fp16"], default="none")
    g.add_argument("--calib-ranks", type=int, help="world size of rows without world_size")
    g.add_argument("--calib-min-mb", type=float, default=0.0,
                   help="fit only rows of at least this many MB (e.g. the bucket size range)")
    g.add_argument("--calib-algo", choices=sorted(ALGORITHMS), default="ring",
                   help="formula fitted to the rows")
    g.add_argument("--calib-scope", choices=["both", "inter", "intra"], default="both",
                   help="which links the fitted α, β replace")
    return ap


def _scenario(args: argparse.Namespace) -> Scenario:
    return Scenario(model=args.model, device=args.device, precision=args.precision,
                    batch_per_gpu=args.batch_per_gpu, gpus_per_node=args.gpus_per_node, net=args.net,
                    intra=args.intra, nics_per_node=args.nics_per_node, algo=args.algo,
                    inter_algo=args.inter_algo, compression=args.compression,
                    bucket_mb=args.bucket_mb, overlap=not args.no_overlap,
                    step_time_s=args.step_time_s, loader_img_s=args.loader_img_s,
                    straggler_cv=args.straggler_cv, params_m=args.params_m,
                    inter_alpha_s=_us(args.inter_alpha_us), intra_alpha_s=_us(args.intra_alpha_us))


def _us(value: float | None) -> float | None:
    return None if value is None else value * 1e-6


def _calibrate(args: argparse.Namespace, sc: Scenario) -> tuple[Scenario, dict]:
    points = select_rows(load_rows(args.calibrate), args.calib_impl, args.calib_compression,
                         args.calib_ranks, args.calib_min_mb * 1e6)
    fit = fit_alpha_beta(points, args.calib_algo, impl=args.calib_impl,
                         compression=args.calib_compression)
    print(f"calibration: {fit.n_rows} rows of impl={fit.impl} compression={fit.compression}, "
          f"{fit.algo} formula: α = {fit.alpha_s * 1e6:.2f} µs, β = 1/({fit.bandwidth_GB_s:.3g} GB/s); "
          f"R² = {fit.r2:.4f}, max relative residual = {100 * fit.max_rel_residual:.1f} %")
    link = fit.link()
    if args.calib_scope in ("both", "inter"):
        sc = replace(sc, inter_link=link)
    if args.calib_scope in ("both", "intra"):
        sc = replace(sc, intra_link=link)
    return sc, asdict(fit)


def _describe(sc: Scenario) -> str:
    compute_s, batch, src = compute_time_s(sc)
    intra, inter = scenario_links(sc)
    return (f"{sc.model} on {sc.device} ({sc.precision}), batch {batch}/GPU, compute "
            f"{compute_s * 1e3:.1f} ms/step [{src}]\n"
            f"allreduce {sc.algo} ({'inter ' + sc.inter_algo + ', ' if sc.algo == 'hierarchical' else ''}"
            f"{sc.compression}), buckets {sc.bucket_mb:g} MB, overlap {'on' if sc.overlap else 'off'}; "
            f"inter α {inter.alpha_s * 1e6:.1f} µs {1e-9 / inter.beta_s_per_byte:.2f} GB/s, "
            f"intra α {intra.alpha_s * 1e6:.1f} µs {1e-9 / intra.beta_s_per_byte:.2f} GB/s")


def _validate(args: argparse.Namespace) -> int:
    rows = validation_rows(straggler_cv=args.straggler_cv)
    print(f"predicted vs published scaling efficiency (straggler cv {args.straggler_cv:g}; "
          "no per-case tuning):")
    print(format_table(rows, VALIDATION_COLUMNS))
    for source, assumed in dict.fromkeys((r["source"].split(" (")[0], r["assumed"]) for r in rows):
        print(f"  {source} — assumed: {assumed}")
    print(_summary(rows))
    nccl = validation_rows(nccl_latency_variant(), straggler_cv=args.straggler_cv)
    print(f"\nsensitivity: Horovod cases with NCCL's own per-hop network latency "
          f"({NCCL_NET_HOP_ALPHA_S * 1e6:g} µs, NCCL tuning.cc) instead of the preset's wire latency:")
    print(format_table(nccl, VALIDATION_COLUMNS))
    print(_summary(nccl))
    if args.json:
        write_json(args.json, {"validation": rows, "nccl_latency_variant": nccl,
                               "straggler_cv": args.straggler_cv})
    return 0


def _summary(rows: list[dict]) -> str:
    within = sum(r["error_pts"] <= 5.0 for r in rows)
    return (f"{within}/{len(rows)} cases within 5 points; "
            f"mean error {sum(r['error_pts'] for r in rows) / len(rows):.1f} points")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.validate:
        return _validate(args)
    sc, calib = _scenario(args), None
    try:
        if args.calibrate:
            sc, calib = _calibrate(args, sc)
        print(_describe(sc))
    except (ValueError, OSError, KeyError) as e:
        print(f"simulate: error: {e}")
        return 2
    counts = gpu_counts(args.nodes * args.gpus_per_node)
    rows = scaling_table(sc, counts, baseline_gpus=args.baseline_gpus, epochs=args.epochs,
                         dataset_size=args.dataset_size)
    print(format_table(rows, SCALING_COLUMNS))
    if args.json:
        write_json(args.json, {"scenario": asdict(sc), "calibration": calib, "rows": rows})
    if args.plot:
        plot_scaling(args.plot, rows, f"{sc.model} on {sc.device}, {sc.algo}, {sc.net}")
    return 0
