"""`python -m hpctrain bench io`: the block plan's read speed against per-sample reads and `cat`.

On a generated ImageNet-like dataset (3×224×224 uint8 samples, ``--size-gb`` GiB, made once in
``--dir`` and reused; ``--clean`` deletes it) the table gives samples/s and MB/s of

* ``cat`` of the shard files to /dev/null — the storage bound (rank 0 alone);
* the per-epoch block plan as the loader reads it (contiguous runs + window shuffle), with serial
  per-shard HDF5, with parallel HDF5 (``mpio``) and with node-level reading (one reader per node
  filling an MPI-3 shared window), all ranks reading their share at once;
* the full loader (plus normalisation to float32 in its prefetch thread);
* the integrity check (``shards.py``, ``blocks.py``): the first epoch with the per-block digests
  of an index v4, XXH3-128 (metadata blocks checked at open, each data block as it is first
  read), and of a v3, SHA-256, on the same files; for comparison the whole-file SHA-256 pass of
  a v1/v2 index (collective at open, each shard hashed by one rank) and the first epoch
  including it; the full loader with its check. Every other row
  reads with the check off — after the first epoch a job's reads are exactly those rows;
* per-sample random ``x[i]``, ``y[i]`` h5py reads, the map-style-dataset anti-pattern,

with a cold page cache (``/proc/sys/vm/drop_caches``, else ``posix_fadvise(DONTNEED)`` per file,
said in the header) and a warm one, and ratios to the random reads and to ``cat`` measured in the
same run. A second, CIFAR-like dataset (3×32×32, ``--small-gb``) repeats the cat / block plan /
random rows: with 3 KB samples the per-call cost of a random read dominates, with 147 KB samples
the copy does. Last, the data-wait share of a training step of the default job (digits CNN, global
batch 64): the time the training thread waited for the loader over the time of the steps.

    python -m hpctrain bench io                       # 1 rank
    mpiexec -n 2 python -m hpctrain bench io          # 2 ranks: node reader and mpio vs per-rank
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import time

import numpy as np
from mpi4py import MPI

from hpctrain.data import ShardLoader, ShardSet, read_index
from hpctrain.data.noderead import NodeReader
from hpctrain.data.index import BLOCK_BYTES, BLOCK_DIGEST, INDEX, write_index
from hpctrain.data.shardwriter import ShardWriter, shard_digests
from hpctrain.topology import Topology

SHAPE = (3, 224, 224)
SMALL = (3, 32, 32)
MB = 1e6
CHECK, FIRST, FIRST_SHA, WHOLE, PLAIN, LOADER = (
    "whole-file SHA-256 check at open (v1/v2 index)", "first epoch, XXH3-128 per block as read (v4 index)",
    "first epoch, SHA-256 per block as read (v3 index)", "first epoch incl. whole-file SHA-256 check at open",
    "block plan, per-rank reading, serial", "full loader")
SHA_BLOCKS = "sha256-blocks.json"     # the same shards' SHA-256 block digests: the v3 rows


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m hpctrain bench io", description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0, help="dataset size in GiB (default %(default)s)")
    ap.add_argument("--dir", default="/tmp/hpctrain-io-bench", help="where the dataset lives (default %(default)s)")
    ap.add_argument("--small-gb", type=float, default=0.25,
                    help="GiB of CIFAR-like 3x32x32 samples, where per-call costs dominate (0: skip)")
    ap.add_argument("--clean", action="store_true", help="delete the generated datasets and exit")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32, help="per-rank batch")
    ap.add_argument("--block-size", type=int, default=32, help="samples per block of the plan")
    ap.add_argument("--shuffle-window", type=int, default=256)
    ap.add_argument("--random-samples", type=int, default=3000,
                    help="per-sample reads per rank (at most; x20 for the small samples)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache rows")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the unchecked and checked first "
                    "epochs (block plan and full loader); their rows give the median (default %(default)s)")
    ap.add_argument("--job-steps", type=int, default=150, help="training steps for the data-wait share")
    ap.add_argument("--job-only", action="store_true", help="only the default job's data-wait share")
    ap.add_argument("--job-driver", choices=("auto", "mpio", "serial"), help="HDF5 driver of the job "
                    "(default: the config default, data.hdf5_driver)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    return ap.parse_args(argv)


def n_samples(size_gb: float, shape: tuple) -> int:
    return int(size_gb * 2**30 // np.prod(shape)) + 1


def generate(directory: str, n: int, shape: tuple, n_shards: int) -> None:
    """Random uint8 image shards (rank 0), written once; the index goes last."""
    rng = np.random.default_rng(0)
    os.makedirs(directory, exist_ok=True)
    entries, chunk = [], max(1, (32 << 20) // int(np.prod(shape)))
    for i in range(n_shards):
        lo, hi = i * n // n_shards, (i + 1) * n // n_shards
        w = ShardWriter(directory, "train", i, n_shards, hi - lo, shape, np.uint8)
        for a in range(lo, hi, chunk):
            b = min(hi, a + chunk)
            w.write(rng.integers(0, 256, (b - a, *shape), dtype=np.uint8), rng.integers(0, 1000, b - a))
        entries.append(w.finish())
    sha = [shard_digests(os.path.join(directory, e["file"]), BLOCK_BYTES, "sha256")["blocks"] for e in entries]
    with open(os.path.join(directory, SHA_BLOCKS), "w") as fh:
        json.dump(sha, fh)
    write_index(directory, {"sample_shape": list(shape), "dtype": "uint8", "num_classes": 1000,
                            "class_names": [str(c) for c in range(1000)],
                            "normalize": {"mean": [127.5] * 3, "std": [73.9] * 3},
                            "splits": {"train": {"num_samples": n, "shards": entries}}})


def ensure(directory: str, n: int, shape: tuple, n_shards: int, comm) -> None:
    """Generate on rank 0 unless a matching dataset is already there (reused across runs)."""
    if comm.Get_rank() == 0:
        ok = False
        if os.path.exists(os.path.join(directory, INDEX)):
            idx = read_index(directory)
            ok = (idx.num_samples("train") == n and tuple(idx.sample_shape) == shape
                  and os.path.exists(os.path.join(directory, SHA_BLOCKS))
                  and all(BLOCK_DIGEST in e.get("blocks", {}) for e in idx.split("train")["shards"]))  # older: redo
        if not ok:
            shutil.rmtree(directory, ignore_errors=True)
            t0 = time.perf_counter()
            generate(directory, n, shape, n_shards)
            print(f"generated {directory} in {time.perf_counter() - t0:.1f} s")
    comm.Barrier()


def drop_cache(files: list[str]) -> str:
    """Evict the files from the page cache; returns the method that worked."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "posix_fadvise(DONTNEED) (drop_caches not permitted)"


class Bench:
    def __init__(self, args, comm, topo, directory, label: str):
        self.args, self.comm, self.topo, self.label = args, comm, topo, label
        self.index = read_index(directory)
        self.index_v3 = with_sha256_blocks(self.index, directory)
        self.files = [os.path.join(directory, e["file"]) for e in self.index.split("train")["shards"]]
        self.sample_bytes = int(np.prod(self.index.sample_shape))
        self.rows: list[dict] = []
        self.cold_method, self.cpu_s = None, None

    def timed(self, fn) -> tuple[int, float]:
        """Run ``fn() -> samples`` on every rank at once: (total samples, slowest rank's seconds).
        The CPU seconds of all ranks' threads go to the next row: a cost that other jobs on the
        host do not change, where they do change the seconds."""
        self.comm.Barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        n = fn()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        self.cpu_s = self.comm.allreduce(dc, MPI.SUM)
        return self.comm.allreduce(n, MPI.SUM), self.comm.allreduce(dt, MPI.MAX)

    def prepare(self, cache: str) -> None:
        if cache == "cold":
            method = drop_cache(self.files) if self.topo.rank == 0 else None
            self.cold_method = self.comm.bcast(method, root=0)
        self.comm.Barrier()

    def row(self, name: str, cache: str, samples: int, secs: float, n_bytes: float | None = None) -> None:
        n_bytes = samples * self.sample_bytes if n_bytes is None else n_bytes
        self.rows.append({"data": self.label, "method": name, "cache": cache, "samples_per_s": samples / secs,
                          "mb_per_s": n_bytes / secs / MB, "samples": samples, "seconds": secs, "cpu_s": self.cpu_s})
        self.cpu_s = None

    def cat(self, cache):
        self.prepare(cache)
        t0 = time.perf_counter()
        if self.topo.rank == 0:
            subprocess.run(["cat", *self.files], stdout=subprocess.DEVNULL, check=True)
        dt = self.comm.bcast(time.perf_counter() - t0, root=0)
        n_bytes = sum(os.path.getsize(f) for f in self.files)
        self.row("cat > /dev/null (storage bound, 1 process)", cache, int(n_bytes // self.sample_bytes), dt, n_bytes)

    def check(self, cache):
        """The whole-file SHA-256 pass of a v1/v2 index at open (shards spread over the ranks)."""
        self.prepare(cache)
        opened = []

        def open_set() -> int:
            opened.append(ShardSet(self.index, "train", comm=self.comm, driver="serial", per_block=False))
            return 0
        n, dt = self.timed(open_set)
        opened[0].close()
        n_bytes = sum(os.path.getsize(f) for f in self.files)
        self.row(f"{CHECK}, each shard by 1 of {self.topo.size} rank(s)", cache,
                 self.index.num_samples("train"), dt, n_bytes)

    def plan_checked(self, cache, how: str = "xxh3_128"):
        """A job's first epoch with its check (later epochs: the plain rows): per block as read
        (``how``: the v4 index's XXH3-128 or the v3 index's SHA-256), or the whole-file pass at
        open (``"whole"``), then the block plan."""
        self.prepare(cache)
        opened = []
        index = self.index_v3 if how == "sha256" else self.index

        def run():
            opened.append(ShardSet(index, "train", comm=self.comm, driver="serial", per_block=how != "whole"))
            return sum(len(y) for _, y in self.loader(opened[0]).raw_batches(0))
        n, dt = self.timed(run)
        opened[0].close()
        name = {"xxh3_128": FIRST, "sha256": FIRST_SHA, "whole": WHOLE}[how]
        self.row(f"{name} (block plan, pread)", cache, n, dt)

    def loader(self, shards, node_comm=None) -> ShardLoader:
        a = self.args
        return ShardLoader(shards, rank=self.topo.rank, size=self.topo.size, batch_size=a.batch_size,
                           block_size=a.block_size, shuffle_window=a.shuffle_window, prefetch=2, node_comm=node_comm)

    def plan(self, cache, driver="serial"):
        shards = ShardSet(self.index, "train", comm=self.comm, driver=driver, verify="off")
        ld = self.loader(shards)
        self.prepare(cache)
        n, dt = self.timed(lambda: sum(len(y) for _, y in ld.raw_batches(0)))
        name = "parallel HDF5 (mpio)" if shards.driver == "mpio" else "serial, pread of contiguous datasets"
        self.row(f"block plan, per-rank reading, {name}", cache, n, dt)
        shards.close()

    def node(self, cache):
        t = self.topo
        shards = (ShardSet(self.index, "train", comm=t.inter, verify="off") if t.local_rank == 0
                  else ShardSet(self.index, "train", verify="off"))
        ld = self.loader(shards)
        reader = NodeReader(ld, t.intra, slots=2)
        self.prepare(cache)

        def run():
            reader.start(0, 0)
            return sum(len(y) for _, y in reader.batches(0, 0))
        n, dt = self.timed(run)
        self.row(f"block plan, node reader ({t.local_size} ranks/node, MPI-3 shared window)", cache, n, dt)
        reader.close()
        shards.close()

    def full_loader(self, cache, verify="off"):
        shards = ShardSet(self.index, "train", verify=verify)
        ld = self.loader(shards)
        self.prepare(cache)
        n, dt = self.timed(lambda: sum(len(y) for _, y in ld.epoch(0)))
        self.row(f"{LOADER} (+ float32 normalisation, prefetch thread)" if verify == "off" else
                 f"{LOADER}, checksums checked in its thread (first epoch)", cache, n, dt)
        ld.close()
        shards.close()

    def random(self, cache):
        import h5py
        shards = ShardSet(self.index, "train", verify="off")
        rng = np.random.default_rng(1 + self.topo.rank)
        count = self.args.random_samples * (20 if self.sample_bytes < 10_000 else 1)
        picks = rng.permutation(shards.num_samples)[:count]
        files = [h5py.File(f, "r") for f in self.files]
        self.prepare(cache)

        def run():
            for g in picks:
                i = int(np.searchsorted(shards.starts, g, side="right")) - 1
                k = int(g - shards.starts[i])
                files[i]["x"][k]
                files[i]["y"][k]
            return len(picks)
        n, dt = self.timed(run)
        self.row("per-sample random h5py reads (anti-pattern)", cache, n, dt)
        for f in files:
            f.close()


def data_wait_share(comm, topo, steps: int, driver: str | None = None) -> dict:
    """Train the default job's model (digits CNN, global batch 64) and time the loader waits."""
    import torch
    from hpctrain.data.builtin import resolve_dataset
    from hpctrain.models import build_model
    torch.set_num_threads(1)
    from hpctrain.config import DataConfig
    from hpctrain.data import train_loader_from_config
    cfg = DataConfig()                                    # the default job's data options
    idx = read_index(resolve_dataset(cfg.dataset, cfg.cache_dir, comm))
    ld = train_loader_from_config(idx, topo, cfg, batch_size=64 // topo.size, seed=0,
                                  hdf5_driver=driver or cfg.hdf5_driver)
    driver = ld.shards.driver
    torch.manual_seed(0)
    model = build_model("digits_cnn", num_classes=idx.num_classes, in_channels=idx.sample_shape[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    done, epoch, t0 = 0, 0, time.perf_counter()
    ld.stats.reset()
    while done < steps:
        for x, y in ld.epoch(epoch):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            for p in model.parameters():          # the gradient mean, as the flat strategy computes it
                assert p.grad is not None
                g = p.grad.numpy()
                comm.Allreduce(MPI.IN_PLACE, g)
                g /= topo.size
            opt.step()
            done += 1
            if done >= steps:
                break
        epoch += 1
    total = time.perf_counter() - t0
    ld.close()
    shares = comm.allgather(ld.stats.wait_s / total)
    return {"steps": done, "step_ms": 1e3 * total / done, "driver": driver, "wait_share_max": max(shares),
            "wait_share_mean": float(np.mean(shares))}


def medians(rows: list) -> list:
    """One row per method (first-seen order): the round of median time, the median CPU seconds."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    out = []
    for same in by.values():
        r = sorted(same, key=lambda r: r["seconds"])[len(same) // 2]
        cpu = sorted(r["cpu_s"] for r in same)[len(same) // 2]
        out.append({**r, "rounds": len(same), "cpu_s": cpu})
    return out


def with_sha256_blocks(index, directory: str):
    """``index`` with the SHA-256 block digests saved beside it (``generate``), as a v3 index holds them."""
    with open(os.path.join(directory, SHA_BLOCKS)) as fh:
        sha = json.load(fh)
    train = index.split("train")
    shards = [{**e, "blocks": b} for e, b in zip(train["shards"], sha)]
    return dataclasses.replace(index, splits={**index.splits, "train": {**train, "shards": shards}})


def table(rows: list, job: dict, header: str) -> str:
    out = [header, f"{'data':<13} {'method':<66} {'cache':<5} {'samples/s':>10} {'MB/s':>8} "
                   f"{'vs random':>9} {'vs cat':>7}"]
    base = {(r["data"], r["cache"]): r for r in rows if r["method"].startswith("per-sample")}
    cat = {(r["data"], r["cache"]): r for r in rows if r["method"].startswith("cat")}
    for r in rows:
        key = (r["data"], r["cache"])
        vr = r["samples_per_s"] / base[key]["samples_per_s"] if key in base else float("nan")
        vc = r["mb_per_s"] / cat[key]["mb_per_s"] if key in cat else float("nan")
        out.append(f"{r['data']:<13} {r['method']:<66} {r['cache']:<5} {r['samples_per_s']:>10.0f} "
                   f"{r['mb_per_s']:>8.0f} {vr:>8.1f}x {100 * vc:>6.0f}%")
    out += integrity(rows)
    out.append(f"default job (digits CNN, global batch 64, HDF5 {job['driver']}, {job['steps']} steps, "
               f"{job['step_ms']:.2f} ms/step): "
               f"data-wait share {100 * job['wait_share_mean']:.2f} % (worst rank {100 * job['wait_share_max']:.2f} %)")
    return "\n".join(out)


def integrity(rows: list) -> list[str]:
    """One line per cache state: the checks' cost against the same run's unchecked row (medians of
    the same interleaved rounds), in speed and in CPU seconds (the unchecked epoch's over the checked
    one's: the speed share a host with no spare core would see)."""
    out = []
    for cache in ("cold", "warm"):
        got: dict[str, dict] = {}
        plain: list = []
        for r in rows:
            if r["cache"] != cache or r["data"] != rows[0]["data"]:
                continue
            for m in (CHECK, FIRST, FIRST_SHA, WHOLE):
                if r["method"].startswith(m):
                    got.setdefault(m, r)
            if r["method"].startswith(PLAIN) and not plain:       # the serial row before the auto one
                plain = [r["samples_per_s"], r["cpu_s"]]
        if CHECK not in got or not plain:
            continue
        base = plain[0]
        cpu = plain[1]
        line = (f"integrity ({cache}): first epoch with per-block XXH3-128 as read (v4): "
                f"{100 * got[FIRST]['samples_per_s'] / base:.0f} % of the unchecked block plan "
                f"(CPU: {100 * cpu / got[FIRST]['cpu_s']:.0f} %); with per-block SHA-256 (v3): "
                f"{100 * got[FIRST_SHA]['samples_per_s'] / base:.0f} % "
                f"(CPU: {100 * cpu / got[FIRST_SHA]['cpu_s']:.0f} %); with the "
                f"whole-file check at open (v1/v2, {got[CHECK]['seconds']:.2f} s, {got[CHECK]['mb_per_s']:.0f} MB/s): "
                f"{100 * got[WHOLE]['samples_per_s'] / base:.0f} %; later epochs 100 % (same reads)")
        loaders = [r for r in rows if r["cache"] == cache and r["method"].startswith(LOADER)]
        if len(loaders) == 2:
            line += (f"; full loader with its check: "
                     f"{100 * loaders[1]['samples_per_s'] / loaders[0]['samples_per_s']:.0f} % of unchecked")
        out.append(line)
    return out


def section(b: Bench, full: bool) -> None:
    """Cold rows (cache dropped before each), then warm rows; ``full`` adds mpio, node, loader."""
    for cache in ([] if b.args.no_cold else ["cold"]) + ["warm"]:
        if cache == "warm":
            b.cat("warm")                                   # warms the cache; the second pass is timed
            b.rows.pop()
        b.cat(cache)
        first = len(b.rows)
        for _ in range(b.args.rounds if full else 1):       # the checks interleaved with the unchecked rows
            b.plan(cache, "serial")
            if full:
                b.plan_checked(cache)
                b.plan_checked(cache, "sha256")
                b.check(cache)
                b.plan_checked(cache, "whole")
        b.rows[first:] = medians(b.rows[first:])
        if cache == "warm" and full:
            b.plan(cache, "auto")
            b.node(cache)
            first = len(b.rows)
            for _ in range(b.args.rounds):                 # what a job's loader thread sees, both ways
                b.full_loader(cache)
                b.full_loader(cache, verify="shared")
            b.rows[first:] = medians(b.rows[first:])
        b.random(cache)


def main(argv) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    small_dir = args.dir.rstrip("/") + "-small"
    if args.clean:
        for d in (args.dir, small_dir):
            if comm.Get_rank() == 0 and os.path.isdir(d):
                shutil.rmtree(d)
                print(f"removed {d}")
        return 0
    topo = Topology.create(comm)
    if args.job_only:
        job = data_wait_share(comm, topo, args.job_steps, args.job_driver)
        if topo.rank == 0:
            print(table([], job, f"io bench: default job only, {topo.size} rank(s)"))
        topo.close()
        return 0
    ensure(args.dir, n_samples(args.size_gb, SHAPE), SHAPE, args.shards, comm)
    big = Bench(args, comm, topo, args.dir, "3x224x224")
    section(big, full=True)
    rows = big.rows
    if args.small_gb > 0:
        ensure(small_dir, n_samples(args.small_gb, SMALL), SMALL, args.shards, comm)
        small = Bench(args, comm, topo, small_dir, "3x32x32")
        section(small, full=False)
        rows += small.rows
    job = data_wait_share(comm, topo, args.job_steps, args.job_driver)
    if topo.rank == 0:
        n_bytes = sum(os.path.getsize(f) for f in big.files)
        header = (f"io bench: {n_bytes / 2**30:.2f} GiB in {len(big.files)} shards at {args.dir} "
                  f"({big.index.num_samples('train')} samples of 3x224x224 uint8); {args.small_gb} GiB of 3x32x32 "
                  f"at {small_dir}; {topo.size} rank(s), batch {args.batch_size}/rank, block {args.block_size}, "
                  f"window {args.shuffle_window}; cold cache: {big.cold_method or 'skipped'}; first-epoch rows: "
                  f"median of {args.rounds} interleaved rounds")
        print(table(rows, job, header))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"rows": rows, "job": job, "header": header}, fh, indent=1)
    topo.close()
    return 0
