"""`python -m hpctrain bench kernels`: fused kernels vs a plain copy of the same bytes.

For each payload size (MB of fp32 gradients, split into `--tensors` tensors of mixed sizes) the
table gives the best-of-N time, the payload throughput (fp32 bytes / s) and its ratio to
`numpy.copyto` and torch `copy_` of the same fp32 bytes measured in the same run. A ratio of
0.5 means the kernel moves the payload at half the speed of copying it. (`lars_update`
touches five words per element, copying two.) On the CPU the torch
references run (one torch thread by default, as one rank per core); with CuPy and a GPU
(`--device cuda`, the default when available) the CUDA kernels run and `cupy.copyto` is the
baseline, timed with CUDA events.

    python -m hpctrain bench kernels --sizes-mb 1,16,256 --json kernels.json
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from hpctrain import kernels

MB = 1 << 20


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m hpctrain bench kernels",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="1,4,16,64,256",
                        help="comma-separated fp32 payload sizes in MB (default: %(default)s)")
    parser.add_argument("--tensors", type=int, default=8,
                        help="split the payload into this many tensors of mixed sizes")
    parser.add_argument("--scale", type=float, default=0.5, help="pack scale (unpack uses 1/scale)")
    parser.add_argument("--min-time-s", type=float, default=0.2,
                        help="repeat each measurement at least this long")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    args.sizes_mb = [float(s) for s in args.sizes_mb.split(",") if s.strip()]
    if args.tensors < 1 or not args.sizes_mb or min(args.sizes_mb) <= 0:
        parser.error("--tensors must be >= 1 and sizes positive")
    return args


def split_sizes(n_elems, n_tensors):
    """Mixed tensor sizes (weights 1..7 repeating) that add up to `n_elems`."""
    weights = np.array([(i % 7) + 1 for i in range(n_tensors)], dtype=np.float64)
    sizes = np.floor(weights / weights.sum() * n_elems).astype(np.int64)
    sizes[-1] += n_elems - sizes.sum()
    return [int(s) for s in sizes]


def best_time_s(fn, min_time_s, sync=lambda: None):
    """Best wall time of repeated calls (after one warm-up), repeated >= 3 times and min_time_s."""
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < min_time_s:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def cpu_cases(n_elems, args):
    sizes = split_sizes(n_elems, args.tensors)
    src = torch.randn(n_elems) * 100
    dst = torch.empty(n_elems)
    src_np, dst_np = src.numpy(), dst.numpy()
    tensors = list(torch.split(src, sizes))
    targets = list(torch.split(dst, sizes))
    buf = torch.empty(n_elems, dtype=torch.float16)
    kernels.pack_fp16(tensors, buf, args.scale)
    grads, moms = torch.randn(n_elems).split(sizes), torch.zeros(n_elems).split(sizes)
    steps = torch.full((len(sizes),), 1e-6)
    return {
        "numpy.copyto": lambda: np.copyto(dst_np, src_np),
        "torch copy_": lambda: dst.copy_(src),
        **kernel_cases(tensors, buf, targets, grads, moms, steps, args.scale),
    }, lambda: None


def kernel_cases(tensors, buf, targets, grads, moms, steps, scale: float) -> dict:
    """The kernels' rows, the same on either backend (the arrays decide which one runs)."""
    return {
        f"pack_fp16 x{scale:g}": lambda: kernels.pack_fp16(tensors, buf, scale),
        "pack_fp16 x1": lambda: kernels.pack_fp16(tensors, buf, 1.0),
        "unpack_fp16": lambda: kernels.unpack_fp16(buf, targets, 1 / scale),
        "unpack_fp16 +=": lambda: kernels.unpack_fp16(buf, targets, 1 / scale, True),
        "sq_norms": lambda: kernels.multi_tensor_sq_norms(tensors),
        "lars_update": lambda: kernels.lars_update(tensors, grads, moms, steps, 1e-4, 0.9),
    }


def cuda_cases(n_elems, args):
    import cupy

    sizes = split_sizes(n_elems, args.tensors)
    src = cupy.random.standard_normal(n_elems, dtype=cupy.float32) * 100
    dst = cupy.empty_like(src)
    bounds = np.cumsum(sizes)[:-1]
    tensors, targets = cupy.split(src, bounds), cupy.split(dst, bounds)
    buf = cupy.empty(n_elems, dtype=cupy.float16)
    grads = cupy.split(cupy.random.standard_normal(n_elems, dtype=cupy.float32), bounds)
    moms = cupy.split(cupy.zeros(n_elems, dtype=cupy.float32), bounds)
    steps = cupy.full(len(sizes), 1e-6, dtype=cupy.float32)
    return {
        "cupy.copyto": lambda: cupy.copyto(dst, src),
        **kernel_cases(tensors, buf, targets, grads, moms, steps, args.scale),
    }, cupy.cuda.get_current_stream().synchronize


def run(args):
    device = args.device
    if device == "auto":
        device = kernels.backend()[0]
    elif device == "cuda" and kernels.backend()[0] != "cuda":
        raise SystemExit(f"--device cuda: {kernels.backend()[1]}")
    make_cases = cuda_cases if device == "cuda" else cpu_cases
    baselines = ("cupy.copyto",) if device == "cuda" else ("numpy.copyto", "torch copy_")
    rows = []
    for size_mb in args.sizes_mb:
        n_elems = int(size_mb * MB) // 4
        cases, sync = make_cases(n_elems, args)
        times = {name: best_time_s(fn, args.min_time_s, sync) for name, fn in cases.items()}
        for name, seconds in times.items():
            row = {"op": name, "size_mb": size_mb, "n_tensors": args.tensors,
                   "time_ms": seconds * 1e3, "payload_gb_s": n_elems * 4 / seconds / 1e9}
            for base in baselines:
                row[f"vs {base}"] = times[base] / seconds
            rows.append(row)
        del cases
    return device, baselines, rows


def print_table(device, baselines, rows, args):
    print(f"kernels bench on {device} ({kernels.backend()[1]}); torch threads={args.threads}; "
          f"{args.tensors} tensors; best of >= 3 runs")
    ratios = "".join(f"{'vs ' + b:>18}" for b in baselines)
    head = f"{'op':<16}{'MB':>7}{'ms':>10}{'GB/s':>8}{ratios}"
    print(head)
    print("-" * len(head))
    for row in rows:
        ratios = "".join(f"{row['vs ' + b]:>18.2f}" for b in baselines)
        print(f"{row['op']:<16}{row['size_mb']:>7g}{row['time_ms']:>10.3f}"
              f"{row['payload_gb_s']:>8.2f}{ratios}")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        device, baselines, rows = run(args)
    finally:
        torch.set_num_threads(previous_threads)
    print_table(device, baselines, rows, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": device, "backend": kernels.backend()[1], "threads": args.threads,
                       "rows": rows}, fh, indent=1)
    return 0
