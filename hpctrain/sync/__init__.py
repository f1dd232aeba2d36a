"""Update algorithms: how averaged gradients become parameter updates (``sync.algorithm``).

========  ===========================================================================
ssgd      synchronous SGD: every step waits for the gradient mean (the default)
========  ===========================================================================
"""
from __future__ import annotations

from hpctrain.sync.ssgd import SSGD, StepResult

ALGORITHMS = {"ssgd": SSGD}


def create(name: str, model, optimizer, grad_sync, **kwargs):
    try:
        cls = ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"sync.algorithm: unknown algorithm {name!r} (choose from {', '.join(ALGORITHMS)})") from None
    return cls(model, optimizer, grad_sync, **kwargs)


__all__ = ["ALGORITHMS", "SSGD", "StepResult", "create"]
