"""Where ``hierarchical``'s node sum spends its time, on one bucket's buffers in a shared window.

    mpiexec -n 2 .venv/bin/python -m hpctrain.tools.bench.node_sum [--elems 4200000] [--repeats 40]

Every local rank owns an input and an output of ``--elems`` fp32 in one MPI-3 shared-memory
window, as :class:`hpctrain.comm.hierarchical.HierarchicalSync` lays out a bucket (the default is
one bucket of the 12.7 M-parameter MLP of ``bench step``). Before each timed call a rank reads
its output (as the optimiser reads ``p.grad``, a view of it) and writes its input (as backward
does: the lines are dirty in its own cache), then a barrier: without the read, the state the
previous variant left the output's lines in (written by the other core) changed the push's time
by half. Each call is
timed on every rank, the slowest rank's counts; the variants take turns call by call, so load
hits all alike. Two clocks: the wall, and the thread's CPU time (steadier on a loaded host: time
the rank spent descheduled is not in it; memory stalls are).

Variants (each rank its 1/n slice, as in training, except ``copy``):

* ``copy``: the floor's copy rate: ``copy_`` between a rank's own two whole buffers;
* ``sum``: :func:`~hpctrain.comm.fused.sum_into` as the strategy calls it (scale 1/n, the slice
  copied into every other output, the check); ``sum@1M``: the same in 1 MiB chunks (``--chunks``:
  more sizes, ``sum@N`` for chunks of N elements);
* ``no-check``, ``no-push``: ``sum`` without the check, without the copies to other outputs;
* ``add``: the adds alone, no scale, copy or check;
* ``read-own``, ``read-other``: one sum over this rank's, or another rank's, input slice (lines
  dirty in the other core's cache: what crossing cores costs).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from mpi4py import MPI

from hpctrain.comm.fused import sum_into
from hpctrain.comm.window import SharedWindow, aligned

CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def variants(ins, outs, me: int, n_elems: int, chunks=()) -> dict:
    """The calls to time, by name, over local rank ``me``'s slice of the buffers (``chunks``: more
    ``sum@N`` variants, the sum in chunks of N elements)."""
    n = len(ins)
    lo, hi = n_elems * me // n, n_elems * (me + 1) // n
    mine = outs[me][lo:hi]
    others = [o[lo:hi] for r, o in enumerate(outs) if r != me]
    srcs = [t[lo:hi] for t in ins]
    scale = 1.0 / n
    other_in = srcs[(me + 1) % n]
    chunked = {f"sum@{c}": (lambda c=c: sum_into(srcs, mine, scale, copies=others, check=True, chunk=c))
               for c in chunks}
    return {
        "copy": lambda: outs[me].copy_(ins[me]),
        "sum": lambda: sum_into(srcs, mine, scale, copies=others, check=True),
        "sum@1M": lambda: sum_into(srcs, mine, scale, copies=others, check=True, chunk=1 << 18),
        **chunked,
        "no-check": lambda: sum_into(srcs, mine, scale, copies=others),
        "no-push": lambda: sum_into(srcs, mine, scale, check=True),
        "add": lambda: sum_into(srcs, mine),
        "read-own": lambda: srcs[me].sum(),
        "read-other": lambda: other_in.sum(),
    }


def run(intra: MPI.Comm, n_elems: int, repeats: int, chunks=()) -> dict[str, dict[str, list[float]]]:
    """Seconds of each variant per repeat, per clock, the slowest rank's (collective on ``intra``)."""
    me = intra.Get_rank()
    n_bytes = aligned(n_elems * 4)
    win = SharedWindow(intra, 2 * n_bytes)
    try:
        ins = [win.view(r, 0, n_elems, torch.float32) for r in range(intra.Get_size())]
        outs = [win.view(r, n_bytes, n_elems, torch.float32) for r in range(intra.Get_size())]
        grad = torch.randn(n_elems, generator=torch.Generator().manual_seed(me))
        calls = variants(ins, outs, me, n_elems, chunks)
        times: dict = {k: {c: [] for c in CLOCKS} for k in calls}
        for _ in range(repeats):
            for name, call in calls.items():
                outs[me].sum()
                ins[me].copy_(grad)
                win.sync()
                intra.Barrier()
                win.sync()
                start = {clock: now() for clock, now in CLOCKS.items()}
                call()
                spent = {clock: now() - start[clock] for clock, now in CLOCKS.items()}
                win.sync()
                intra.Barrier()
                for clock, s in spent.items():
                    times[name][clock].append(intra.allreduce(s, op=MPI.MAX))
        del ins, outs, calls
        return times
    finally:
        win.free()


def format_times(times: dict, n_elems: int, n_ranks: int) -> str:
    bucket = n_elems * 4
    lines = [f"node sum: {n_ranks} ranks, a bucket of {n_elems} fp32 ({bucket / 2**20:.1f} MiB per rank); "
             "ms per call, the slowest rank's; GB/s: the bucket's bytes per min time",
             f"{'variant':<11} {'wall min':>9} {'wall med':>9} {'cpu min':>9} {'cpu med':>9} {'GB/s cpu':>9}"]
    for name, by_clock in times.items():
        w, c = by_clock["wall"], by_clock["cpu"]
        lines.append(f"{name:<11} {min(w) * 1e3:9.3f} {statistics.median(w) * 1e3:9.3f} "
                     f"{min(c) * 1e3:9.3f} {statistics.median(c) * 1e3:9.3f} {bucket / max(min(c), 1e-9) / 1e9:9.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpctrain.tools.bench.node_sum", description=__doc__.split("\n")[0])
    p.add_argument("--elems", type=int, default=4_200_000, help="fp32 elements per bucket (default: an MLP bucket)")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--chunks", default="", help="more chunk sizes to time the sum in, elements, comma-separated "
                   "(e.g. 65536,32768,16384: a variant sum@N each)")
    args = p.parse_args(argv)
    if args.elems < 1 or args.repeats < 1:
        p.error("--elems and --repeats must be >= 1")
    try:
        chunks = [int(c) for c in args.chunks.split(",") if c.strip()]
    except ValueError:
        p.error(f"--chunks: expected comma-separated element counts, got {args.chunks!r}")
    if any(c < 1 for c in chunks):
        p.error(f"--chunks: every size must be >= 1, got {args.chunks!r}")
    torch.set_num_threads(1)
    intra = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    times = run(intra, args.elems, args.repeats, chunks)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(format_times(times, args.elems, intra.Get_size()))
    intra.Free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
