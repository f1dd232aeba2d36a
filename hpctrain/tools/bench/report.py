"""The frame every MPI benchmark shares: parse, measure on ``COMM_WORLD`` with one torch thread per
rank, then rank 0 prints a header with the machine's load (timings on a shared host mean little
without it), the table, and writes the rows as JSON."""
from __future__ import annotations

import json
import os

import torch
from mpi4py import MPI


def one_minute_load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def run_mpi_bench(argv, parse_args, measure, format_table, header) -> int:
    """``header(args, comm, rows)`` is the first line; ``{load}`` in it is filled in."""
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    rows = measure(args, comm)
    if comm.Get_rank() == 0:
        print(header(args, comm, rows).format(load=f"{one_minute_load():.2f}"))
        print(format_table(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0
