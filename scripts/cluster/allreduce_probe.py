"""A small, self-contained allreduce probe for the emulated cluster (plain mpi4py + torch).

Checks what the emulated network does to flat vs two-level allreduce and fp32 vs fp16 wire,
independently of hpctrain's own strategies (``python -m hpctrain bench allreduce`` measures
those). Every variant moves the same data with the same algorithm, so ratios isolate one effect:

  mpi        MPI_Allreduce (Open MPI's own choice of algorithm), fp32
  flat       reduce-scatter as Alltoall of chunks + local fp32 sum, then Allgather; wire dtype
  hier       node level: Reduce_scatter_block within the node (shared memory, fp32); the
             node's slice goes through ``flat`` across nodes (ranks with the same local index:
             ChainerMN's two-dimensional layout); then Allgather within the node

    python -m hpctrain cluster up --nodes 2 --link 1gbit
    python -m hpctrain cluster mpiexec -n 4 -- .venv/bin/python scripts/cluster/allreduce_probe.py --mb 64
"""
import argparse
import time

import numpy as np
import torch
from mpi4py import MPI

WIRE = {"fp32": torch.float32, "fp16": torch.float16}


def rs_ag(comm, x: torch.Tensor, wire: torch.dtype) -> None:
    """In-place sum over ``comm`` of fp32 ``x`` (length divisible by comm size), ``wire`` on the wire."""
    p = comm.Get_size()
    if p == 1:
        return
    w = x.to(wire)
    recv = torch.empty_like(w)
    comm.Alltoall(_buf(w), _buf(recv))                        # chunk j of everyone → rank j
    mine = recv.view(p, -1).to(torch.float32).sum(0)          # accumulate in fp32
    comm.Allgather(_buf(mine.to(wire)), _buf(w))
    x.copy_(w)


def _buf(t: torch.Tensor):
    """fp16 travels as 16-bit integers: Open MPI 4.1 has no half-precision datatype."""
    return (t.view(torch.int16) if t.dtype == torch.float16 else t).numpy()


def hier(world, intra, inter, x: torch.Tensor, wire: torch.dtype) -> None:
    k = intra.Get_size()
    part = torch.empty(x.numel() // k, dtype=torch.float32)
    intra.Reduce_scatter_block(x.numpy(), part.numpy(), op=MPI.SUM)
    rs_ag(inter, part, wire)
    intra.Allgather(part.numpy(), x.numpy())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=64, help="fp32 buffer size in MB (2**20 bytes)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    intra = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
    inter = world.Split(color=intra.rank, key=world.rank)
    p = world.size
    n = int(args.mb * 2**20 / 4) // (p * intra.size) * (p * intra.size)
    base = torch.full((n,), float(world.rank + 1))
    expect = p * (p + 1) / 2
    variants = {"mpi fp32": lambda x: world.Allreduce(MPI.IN_PLACE, x.numpy()),
                **{f"flat {k}": (lambda x, w=w: rs_ag(world, x, w)) for k, w in WIRE.items()},
                **{f"hier {k}": (lambda x, w=w: hier(world, intra, inter, x, w)) for k, w in WIRE.items()}}
    rows = {}
    for name, fn in variants.items():
        best = float("inf")
        for _ in range(args.reps + 1):                           # first run warms up
            x = base.clone()
            world.Barrier()
            t0 = time.perf_counter()
            fn(x)
            best = min(best, world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        ok = world.allreduce(bool(torch.all(x == expect)), op=MPI.LAND)
        rows[name] = (best, ok)
    if world.rank == 0:
        n_nodes = inter.size
        print(f"{p} ranks, {n_nodes} nodes × {intra.size}, {n * 4 / 2**20:.0f} MiB fp32, best of {args.reps}")
        print(f"{'variant':<10} {'time ms':>9} {'vs mpi':>7} {'correct':>8}")
        for name, (t, ok) in rows.items():
            print(f"{name:<10} {1e3 * t:>9.1f} {rows['mpi fp32'][0] / t:>6.2f}x {str(ok):>8}")
        print(f"hier/flat fp32 {rows['flat fp32'][0] / rows['hier fp32'][0]:.2f}x, "
              f"fp16/fp32 flat {rows['flat fp32'][0] / rows['flat fp16'][0]:.2f}x, "
              f"hier {rows['hier fp32'][0] / rows['hier fp16'][0]:.2f}x")
    for c in (intra, inter):
        c.Free()


if __name__ == "__main__":
    main()
