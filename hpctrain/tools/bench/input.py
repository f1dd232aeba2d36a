"""``python -m hpctrain bench input``: can one rank's input pipeline keep a ResNet-50 GPU fed?

    python -m hpctrain bench input [--images 1024] [--workers 1,2] [--batch 64] [--batches 12]
            [--rounds 3] [--size 224] [--gpu-rate 2600] [--json FILE]

Photos: ``--images`` JPEGs of about 400 × 340 made from scikit-learn's two sample photographs
(:mod:`hpctrain.tools.bench.input_data`), stored whole in one shard directory as ``data_tools convert
--encode jpeg`` writes them. Contenders, interleaved in every round (a burst of load from elsewhere
hits all alike), each timed over ``--batches`` batches of ``--batch`` after its first batch:

* ``hpctrain``: the training loader one rank builds (:class:`ShardLoader`, ``data.augment_kind=rrc``:
  random-resized crop + flip cut at decode time, normalised float32 batches) at each of ``--workers``
  decode threads;
* ``DataLoader``: ``torch.utils.data.DataLoader`` with the same number of worker processes and the
  same transform written with Pillow (:mod:`hpctrain.tools.bench.input_baseline`);
* ``one PIL core``: that transform in a plain loop;
* ``decode only``: full decodes of the same photos, one thread, no crop (simplejpeg, Pillow, and
  PyTurboJPEG when it imports): the decoder's own rate.

Printed: img/s per rank (median over rounds), ratios (medians of per-round ratios) to the
DataLoader at equal workers and to one hpctrain worker, the process's CPU seconds per wall second
(above 1 with threads only if the decoder releases the GIL), and the cores per GPU a node would
need at the measured one-worker rate to feed ``--gpu-rate`` img/s. The default, 2,600 img/s, is
approximately NVIDIA's published ResNet-50 v1.5 mixed-precision training throughput on one A100
(NVIDIA Deep Learning Examples, PyTorch ResNet-50 v1.5 performance tables, DGX A100; about
2,500-3,000 img/s with DALI feeding it; an H100 is faster): an approximate figure, not measured here.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch

from hpctrain.tools.bench.args import comma_list
from hpctrain.tools.bench.report import one_minute_load

GPU_RATE = 2600          # img/s, approximate (module docstring)
RAW = "hpctrain raw uint8"  # the batches a GPU job takes (normalised on the device)


def write_shards(directory: str, blobs: list, size: int = 224) -> str:
    """``blobs`` as one whole-image JPEG shard directory, as ``data_tools convert --encode jpeg`` makes it."""
    from hpctrain.data_tools.sources import Chunk, Source, SplitSource
    from hpctrain.data_tools.writer import convert

    def read(lo, hi):
        return Chunk(list(blobs[lo:hi]), np.arange(lo, hi) % 10, np.full((hi - lo, 3, 1, 1), 118, np.uint8))
    src = Source({"train": SplitSource(len(blobs), read)}, [str(k) for k in range(10)], (3, size, size), "uint8",
                 "jpeg", "bench", extra={"jpeg": {"stored": "whole", "max_side": None}})
    convert(src, directory, 1, resume=False)
    return directory


def _timed(batches, n: int, batch: int) -> tuple[float, float]:
    """(img/s, CPU s per wall s) over ``n`` batches after the first."""
    it = iter(batches)
    next(it)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(n):
        next(it)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return n * batch / wall, cpu / wall


def _epochs(make_iter):
    e = 0
    while True:
        yield from make_iter(e)
        e += 1


def contenders(args, shard_dir: str, blobs: list) -> dict:
    """name -> a function measuring one round: ``() -> (img/s, cpu/wall)``."""
    from hpctrain.data import ShardLoader, ShardSet, read_index
    from hpctrain.data.augment import Augment
    from hpctrain.tools.bench import input_baseline as base

    labels = np.arange(len(blobs)) % 10
    out: dict = {}
    for k in args.workers:
        def ours(k=k, raw=False):
            ld = ShardLoader(ShardSet(read_index(shard_dir), "train"), rank=0, size=1, batch_size=args.batch,
                             transform=Augment("rrc"), workers=k, raw=raw)
            ld.owns_shards = True             # close() closes the shard files too: one ShardSet per round
            try:
                return _timed(_epochs(ld.epoch), args.batches, args.batch)
            finally:
                ld.close()
        out[("hpctrain", k)] = ours
        out[(RAW, k)] = lambda k=k: ours(k, raw=True)
        dl = base.dataloader(blobs, labels, args.batch, k, args.size)
        out[("DataLoader", k)] = lambda dl=dl: _timed(_epochs(lambda e: (base.normalise(x) for x, _ in dl)),
                                                      args.batches, args.batch)
    out[("one PIL core", 1)] = lambda: _timed(_epochs(lambda e: (base.normalise(x) for x, _ in
                                                                 base.one_core(blobs, labels, args.batch, args.size))),
                                              args.batches, args.batch)
    for name, fn in decoders_only().items():
        out[(f"decode only: {name}", 1)] = lambda fn=fn: _decode_rate(fn, blobs, args.batches * args.batch)
    return out


def decoders_only() -> dict:
    """Full decodes, one thread: the candidates that import here."""
    from PIL import Image
    fns = {"PIL": lambda b: np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))}
    try:
        import simplejpeg
        fns["simplejpeg"] = lambda b: simplejpeg.decode_jpeg(b, "RGB")
    except ImportError:
        pass
    try:
        from turbojpeg import TJPF_RGB, TurboJPEG
        tj = TurboJPEG()
        fns["PyTurboJPEG"] = lambda b: tj.decode(b, pixel_format=TJPF_RGB)
    except Exception:  # not installed, or no libturbojpeg it accepts: left out
        pass
    return fns


def _decode_rate(fn, blobs: list, n: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.thread_time()
    for i in range(n):
        fn(blobs[i % len(blobs)])
    wall = time.perf_counter() - t0
    return n / wall, (time.thread_time() - c0) / wall


def gil_ticks(fn, n: int = 10, interval_s: float = 0.3) -> float:
    """Main-thread loop iterations per millisecond spent inside ``fn`` running in another thread,
    with the interpreter's switch interval at ``interval_s`` (longer than the ``n`` calls take):
    the main thread then runs only while ``fn`` has released the GIL, so 0 means ``fn`` holds it,
    hundreds mean it releases it. Load on the host only lowers the count: unlike wall-clock
    scaling, it does not need a free core."""
    import sys
    import threading
    spans: list = []
    ticks: list = []
    done = threading.Event()

    def work():
        for i in range(n):
            t0 = time.perf_counter()
            fn(i)
            spans.append((t0, time.perf_counter()))
        done.set()
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval_s)
    try:
        th = threading.Thread(target=work)
        th.start()
        while not done.is_set():
            ticks.append(time.perf_counter())
        th.join()
    finally:
        sys.setswitchinterval(old)
    t = np.array(ticks)
    inside = sum(int(((t > a) & (t < b)).sum()) for a, b in spans)
    return inside / max(sum(b - a for a, b in spans) * 1e3, 1e-9)


def gil_rows(blobs: list) -> dict:
    """:func:`gil_ticks` of the decoders, torch's resize, and a control that holds the GIL."""
    import torch.nn.functional as F
    fns: dict[str, Callable] = {name: (lambda i, fn=fn: fn(blobs[i % len(blobs)]))
                                for name, fn in decoders_only().items()}
    img = torch.zeros(1, 3, 340, 400, dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    fns["torch resize"] = lambda i: F.interpolate(img, size=(224, 224), mode="bilinear", antialias=True)
    fns["control: sum(range) (holds the GIL)"] = lambda i: sum(range(100_000))
    return {name: gil_ticks(fn) for name, fn in fns.items()}


def measure(args) -> list[dict]:
    from hpctrain.tools.bench.input_data import photos
    torch.set_num_threads(1)
    blobs = photos(args.images, seed=0)
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-input-") as d:
        runs = contenders(args, write_shards(d, blobs, args.size), blobs)
        got: dict = {key: [] for key in runs}
        keys = list(runs)
        for r in range(args.rounds):
            for key in (keys if r % 2 == 0 else keys[::-1]):
                got[key].append(runs[key]())
    rows = rows_of(got, args)
    rows.append({"contender": "GIL check", "ticks_per_ms": gil_rows(blobs)})
    return rows


def rows_of(got: dict, args) -> list[dict]:
    rows = []
    for (name, k), vals in got.items():
        rates = [v[0] for v in vals]
        row = {"contender": name, "workers": k, "img_s": statistics.median(rates),
               "cpu_per_wall": statistics.median(v[1] for v in vals), "rounds": rates,
               "img_per_cpu_s": (statistics.median(v[0] / v[1] for v in vals)
                                 if name != "DataLoader" and min(v[1] for v in vals) > 0.02 else None)}
        base = got.get(("DataLoader", k)) if name == "hpctrain" else None
        if base:
            row["x_dataloader"] = statistics.median(a[0] / b[0] for a, b in zip(vals, base))
        one = got.get((name, 1)) if name in ("hpctrain", RAW) else None
        if one:
            row["x_one_worker"] = statistics.median(a[0] / b[0] for a, b in zip(vals, one))
        rows.append(row)
    return rows


def format_table(rows: list[dict], gpu_rate: float) -> str:
    lines = ["| contender | workers | img/s | x DataLoader | x 1 worker | CPU s / wall s | img per CPU s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    def f(r: dict, key: str) -> str:
        return f"{r[key]:.2f}" if r.get(key) is not None else ""
    gil: dict = next((r["ticks_per_ms"] for r in rows if r["contender"] == "GIL check"), {})
    rows = [r for r in rows if r["contender"] != "GIL check"]
    for r in rows:
        per_cpu = f"{r['img_per_cpu_s']:.0f}" if r.get("img_per_cpu_s") else ""
        lines.append(f"| {r['contender']} | {r['workers']} | {r['img_s']:.0f} | {f(r, 'x_dataloader')} | "
                     f"{f(r, 'x_one_worker')} | {r['cpu_per_wall']:.2f} | {per_cpu} |")
    one = next((r for r in rows if r["contender"] == RAW and r["workers"] == 1), None)
    if one and one.get("img_per_cpu_s"):
        rate = one["img_per_cpu_s"]
        lines.append(f"\nAt {rate:.0f} img per CPU second (hpctrain, raw uint8 batches as a GPU job takes them, "
                     f"1 worker, this host), feeding {gpu_rate:.0f} img/s per GPU (ResNet-50 v1.5, mixed precision: "
                     f"approximately NVIDIA's published A100 figure) needs about {math.ceil(gpu_rate / rate)} cores "
                     f"per GPU.")
    if gil:
        lines.append("GIL released while running (main-thread ticks per ms inside the call, switch interval 0.3 s; "
                     "0 = holds it): " + ", ".join(f"{k} {v:.0f}" for k, v in gil.items()))
    return "\n".join(lines)


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hpctrain bench input", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=1024, help="photos made (about 400 x 340 px)")
    p.add_argument("--workers", type=lambda s: [int(v) for v in comma_list(s)], default=None,
                   help="decode workers to compare (default 1,2,... up to this process's cores)")
    p.add_argument("--batch", type=int, default=64, help="images per batch (per rank)")
    p.add_argument("--batches", type=int, default=12, help="timed batches per contender and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=224, help="output side (the crop is resized to it)")
    p.add_argument("--gpu-rate", type=float, default=GPU_RATE, help="img/s one GPU consumes (see the docstring)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    args.workers = args.workers or list(range(1, max(cores, 2) + 1))
    if min(args.workers) < 1 or min(args.images, args.batch, args.batches, args.rounds) < 1:
        p.error("--workers, --images, --batch, --batches and --rounds must be positive")
    if args.images < args.batch * 2:
        p.error(f"--images {args.images}: at least two batches of {args.batch}")
    return args


def main(argv) -> int:
    args = parse_args(argv)
    rows = measure(args)
    print(f"bench input: {args.images} photos ~400x340 -> {args.size}x{args.size}, batch {args.batch}, "
          f"{args.batches} batches x {args.rounds} rounds, {len(os.sched_getaffinity(0))} cores, "
          f"load {one_minute_load():.2f}")
    print(format_table(rows, args.gpu_rate))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0
