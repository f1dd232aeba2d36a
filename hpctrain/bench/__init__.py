"""``python -m hpctrain bench NAME``: benchmarks that print a table with ratios to a baseline."""
from __future__ import annotations

import importlib
import sys

BENCHES = {
    "allreduce": "hpctrain.bench.allreduce",
    "compat": "hpctrain.bench.compat",
    "ddp": "hpctrain.bench.ddp",
    "input": "hpctrain.bench.input",
    "io": "hpctrain.bench.io",
    "kernels": "hpctrain.bench.kernels",
    "step": "hpctrain.bench.step",
    "sync": "hpctrain.bench.sync",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHES:
        print(f"usage: python -m hpctrain bench {{{','.join(BENCHES)}}} [options]", file=sys.stderr)
        return 2
    try:
        mod = importlib.import_module(BENCHES[argv[0]])
    except ModuleNotFoundError as exc:
        if exc.name == BENCHES[argv[0]]:
            print(f"hpctrain bench: {argv[0]!r} is not available in this version", file=sys.stderr)
            return 2
        raise
    return int(mod.main(argv[1:]) or 0)
