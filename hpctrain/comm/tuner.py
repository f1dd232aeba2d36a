"""Per-bucket choice between MPI's allreduce and the ring, measured at start-up.

Where MPI's own algorithms stop beating the ring depends on the MPI library, its tuning, the
network, the number of ranks and how the call is made (blocking ``Allreduce`` or libnbc's
``Iallreduce``): on the development host it moved several-fold lower when ``flat`` went from
``Iallreduce`` to ``Allreduce`` plus the mean and the inf/NaN check (docs/environment.md). A
fixed threshold (:data:`hpctrain.comm.ring.MPI_MAX_BYTES`, ``comm.tune = static``) is right only
where it was measured. With ``comm.tune = measure`` (the default of a training job) every bucket
of a strategy is timed both ways when the strategy is built, in the spirit of NCCL's tuner and
Open MPI's decision rules, and takes the faster. The measurement is collective: each trial's
time is the slowest rank's, so every rank decides alike.

Cost: ``TRIALS`` timed runs of each method per distinct bucket size, after one untimed run
(once per job, small beside a training run; docs/environment.md). Buckets below
``ring.SMALL_BYTES`` (latency-bound, MPI's) and compressed ones (the ring only: MPI has no
fp16 sum) are not measured.
"""
from __future__ import annotations

import statistics
import time

from mpi4py import MPI

from hpctrain.comm.progress import run
from hpctrain.comm.ring import SMALL_BYTES, RingBuffers, allreduce_bucket, mpi_choice, nonblocking_mpi_ok

TUNES = ("static", "measure")
TRIALS = 3


def check_tune(tune: str) -> str:
    if tune not in TUNES:
        raise ValueError(f"comm.tune: unknown {tune!r} (choose from {', '.join(TUNES)})")
    return tune


def measured(comm: MPI.Comm, src, dst, codec, scale: float, blocking: bool, trials: int = TRIALS) -> dict:
    """Median seconds (slowest rank) of ``allreduce_bucket`` over ``comm`` of ``src`` into ``dst``
    by each method, interleaved trial by trial. ``src`` is read, ``dst`` overwritten."""
    n = comm.Get_size()
    bufs = {m: RingBuffers(src.numel(), src.dtype, n, codec, m, src.device) for m in ("mpi", "ring")}
    times: dict[str, list[float]] = {m: [] for m in bufs}
    for trial in range(trials + 1):
        for m in (("mpi", "ring") if trial % 2 else ("ring", "mpi")):
            comm.Barrier()
            t0 = time.perf_counter()
            run(allreduce_bucket(bufs[m], comm, codec, src, dst, scale, blocking=blocking))
            dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if trial:
                times[m].append(dt)
    return {m: statistics.median(t) for m, t in times.items()}


def choose(comm: MPI.Comm, src, dst, codec, scale: float, blocking: bool, tune: str, cache: dict) -> str:
    """``"mpi"`` or ``"ring"`` for a buffer like ``src`` (collective when measuring: every rank
    of ``comm`` must call it for the same buckets in the same order). ``cache`` maps a byte
    size to its verdict, so buckets of equal size are measured once. Non-blocking rounds of a
    device buffer MPI's ``Iallreduce`` cannot take run the ring whatever is chosen
    (:func:`hpctrain.comm.ring.mpi_route`): nothing to measure, ``"ring"``."""
    n_bytes = src.numel() * src.element_size()
    if not blocking and not nonblocking_mpi_ok(src.device) and comm.Get_size() > 1:
        return "ring"
    static = mpi_choice(n_bytes, codec)
    if tune == "static" or comm.Get_size() == 1 or not codec.mpi_summable or n_bytes <= SMALL_BYTES:
        return static
    if n_bytes not in cache:
        t = measured(comm, src, dst, codec, scale, blocking)
        cache[n_bytes] = "mpi" if t["mpi"] <= t["ring"] else "ring"
    return cache[n_bytes]
