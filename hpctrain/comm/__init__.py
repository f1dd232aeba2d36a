"""Gradient synchronisation strategies, chosen by name (``comm.strategy``).

========  ====================================================================================
name      when to use it
========  ====================================================================================
flat      one MPI Allreduce per fusion bucket; single node or a uniform network
========  ====================================================================================
"""
from __future__ import annotations

from hpctrain.comm.base import Bucket, GradSync, make_buckets
from hpctrain.comm.collectives import allreduce_sum, broadcast_module, broadcast_tensors, checksum
from hpctrain.comm.flat import FlatSync

STRATEGIES: dict[str, type[GradSync]] = {}


def register(cls: type[GradSync]) -> type[GradSync]:
    """Class decorator: make a strategy selectable by its ``name``."""
    STRATEGIES[cls.name] = cls
    return cls


register(FlatSync)


def create(name: str, params, topology, **kwargs) -> GradSync:
    """Build the strategy called ``name``; a ValueError names the valid choices."""
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"comm.strategy: unknown strategy {name!r} (choose from {', '.join(sorted(STRATEGIES))})") from None
    return cls(params, topology, **kwargs)


__all__ = ["Bucket", "GradSync", "make_buckets", "STRATEGIES", "register", "create", "FlatSync",
           "allreduce_sum", "broadcast_module", "broadcast_tensors", "checksum"]
