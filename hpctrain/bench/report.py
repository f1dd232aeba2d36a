"""What every MPI benchmark does after measuring: rank 0 prints a header with the machine's load
(timings on a shared host mean little without it), the table, and writes the rows as JSON."""
from __future__ import annotations

import json
import os


def one_minute_load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def print_rows(comm, header: str, table: str, rows, json_path: str | None) -> None:
    """Rank 0: ``header`` (``{load}`` is filled in), the table, and ``json_path`` if given."""
    if comm.Get_rank() != 0:
        return
    print(header.format(load=f"{one_minute_load():.2f}"))
    print(table)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
