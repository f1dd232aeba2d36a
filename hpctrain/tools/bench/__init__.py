"""``python -m hpctrain bench NAME``: benchmarks that print a table with ratios to a baseline."""
from __future__ import annotations

import importlib
import sys

BENCHES = {
    "allreduce": "hpctrain.tools.bench.allreduce",
    "compat": "hpctrain.tools.bench.compat",
    "ddp": "hpctrain.tools.bench.ddp",
    "input": "hpctrain.tools.bench.input",
    "io": "hpctrain.tools.bench.io",
    "kernels": "hpctrain.tools.bench.kernels",
    "step": "hpctrain.tools.bench.step",
    "sync": "hpctrain.tools.bench.update",
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
