"""`python -m hpctrain bench io`: the block plan's read speed against per-sample reads and `cat`.

On a generated ImageNet-like dataset (3×224×224 uint8 samples, ``--size-gb`` GiB, made once in
``--dir`` and reused; ``--clean`` deletes it) the table gives samples/s and MB/s of

* ``cat`` of the shard files to /dev/null — the storage bound (rank 0 alone);
* the per-epoch block plan as the loader reads it (contiguous runs + window shuffle), with serial
  per-shard HDF5, with parallel HDF5 (``mpio``) and with node-level reading (one reader per node
  filling an MPI-3 shared window), all ranks reading their share at once;
* the full loader (plus normalisation to float32 in its prefetch thread);
* the integrity check (``shard_checks.py``, ``blocks.py``): the first epoch with the per-block digests
  of an index v5, XXH3-128 on a grid aligned with the sample rows (metadata blocks checked at
  open, each data block as it is first read), and of a v3, SHA-256, on the same files; for
  comparison the whole-file SHA-256 pass of a v1/v2 index (collective at open, each shard hashed
  by one rank) and the first epoch including it; the full loader with its check. Every other row
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
import json
import os
import shutil
import subprocess
import time

import numpy as np
from mpi4py import MPI

from hpctrain.data import ShardLoader, ShardSet, read_index
from hpctrain.data.noderead import NodeReader
from hpctrain.tools.bench.io_data import drop_cache, ensure, n_samples, with_sha256_blocks
from hpctrain.tools.bench.io_job import data_wait_share
from hpctrain.tools.bench.io_report import CHECK, FIRST, FIRST_SHA, LOADER, WHOLE, medians, table
from hpctrain.topology import Topology

SHAPE = (3, 224, 224)
SMALL = (3, 32, 32)
MB = 1e6


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
    ap.add_argument("--lanes", type=int, default=0, help="data.lanes of the block plan (0: one per rank)")
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


class Bench:
    def __init__(self, args, comm, topo, directory, label: str):
        self.args, self.comm, self.topo, self.label = args, comm, topo, label
        self.index = read_index(directory)
        self.index_v3 = with_sha256_blocks(self.index, directory)
        self.files = [os.path.join(directory, e["file"]) for e in self.index.split("train")["shards"]]
        self.sample_bytes = int(np.prod(self.index.sample_shape))
        self.rows: list[dict] = []
        self.reads: list[str] = []         # the block plan's read lengths: independent of the machine's load
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
        (``how``: the v5 index's XXH3-128 or the v3 index's SHA-256), or the whole-file pass at
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
                           block_size=a.block_size, shuffle_window=a.shuffle_window, prefetch=2, node_comm=node_comm,
                           lanes=a.lanes)

    def plan(self, cache, driver="serial"):
        shards = ShardSet(self.index, "train", comm=self.comm, driver=driver, verify="off")
        ld = self.loader(shards)
        self.prepare(cache)
        lengths: list[int] = []
        read_into = shards.read_into

        def counted(a, e, *rest):
            lengths.append(e - a)
            return read_into(a, e, *rest)
        shards.read_into = counted               # type: ignore[method-assign]
        n, dt = self.timed(lambda: sum(len(y) for _, y in ld.raw_batches(0)))
        shards.read_into = read_into             # type: ignore[method-assign]
        name = "parallel HDF5 (mpio)" if shards.driver == "mpio" else "serial, pread of contiguous datasets"
        self.row(f"block plan, per-rank reading, {name}", cache, n, dt)
        every = np.concatenate(self.comm.allgather(np.array(lengths, np.int64)))
        self.reads.append(f"{self.label} {name}, {cache}: {len(every)} reads by {self.topo.size} rank(s), "
                          f"samples per read mean {every.mean():.1f}, median {np.median(every):.0f}, "
                          f"min {every.min()}, {(every >= self.args.block_size).mean():.0%} of reads >= a block")
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
        lanes = f"{args.lanes} lanes" if args.lanes else "one lane per rank"
        for line in big.reads + (small.reads if args.small_gb > 0 else []):
            print(f"block plan reads ({lanes}): {line}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"rows": rows, "job": job, "header": header}, fh, indent=1)
    topo.close()
    return 0
