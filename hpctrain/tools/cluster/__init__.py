"""An emulated multi-node cluster on one machine: network namespaces as nodes, shaped veth links,
Open MPI launched across them. ``python -m hpctrain cluster --help``; code in spec.py (pure
layout), netns.py (build/remove), launch.py (mpiexec across nodes), cli.py (the subcommand)."""
from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """``python -m hpctrain cluster ...`` (imports its parts only when used)."""
    from hpctrain.tools.cluster.cli import main as cli_main
    return cli_main(argv)
