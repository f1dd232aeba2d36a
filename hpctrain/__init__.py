"""hpctrain: MPI-native data-parallel deep-learning training for supercomputers.

The public API is imported lazily (PEP 562), so ``import hpctrain`` neither initialises MPI nor
loads torch until a name is used; nothing is printed at import.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"   # the one place: setup.cfg reads it (version = attr: hpctrain.__version__)

_EXPORTS = {
    "init": "hpctrain.api", "broadcast_parameters": "hpctrain.api", "allreduce_metrics": "hpctrain.api",
    "shard_loader": "hpctrain.api", "shard_eval_batches": "hpctrain.api",
    "DistributedTrainer": "hpctrain.trainer",
    "Topology": "hpctrain.topology",
    "LARS": "hpctrain.optim", "LAMB": "hpctrain.optim", "make_optimizer": "hpctrain.optim", "lr_at": "hpctrain.optim",
    "ScheduleSpec": "hpctrain.optim", "spec_from_config": "hpctrain.optim", "LossScaler": "hpctrain.optim",
    "recompute_bn_stats": "hpctrain.models.polish",
    "build_model": "hpctrain.models",
    "Config": "hpctrain.job.config",
    "load_model": "hpctrain.saved",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hpctrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
