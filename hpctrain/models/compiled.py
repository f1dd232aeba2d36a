"""``model.compile``: torch.compile on a model that is already built, broadcast and trained on.

The model is compiled in place (``nn.Module.compile``), not wrapped (``torch.compile(model)``):
the module object stays the one the trainer, the gradient buckets' hooks, OD-SGD, Final
Polishing and the checkpointer hold, so ``state_dict`` keys stay the plain model's (a wrapper's
carry an ``_orig_mod.`` prefix, and a checkpoint saved through it would not load into the plain
model). Only the forward is compiled; autograd accumulates each parameter's gradient outside the
compiled graph, which is where the buckets' hooks fire.

On a CPU, Inductor writes C++ and builds it with the host's compiler at the first forward (and
again for each new input shape or train/eval switch): minutes on a small host, then cached in
``$TORCHINDUCTOR_CACHE_DIR`` (default ``/tmp/torchinductor_$USER``).
"""
from __future__ import annotations

import os
import shutil

from torch import nn

from hpctrain.errors import ConfigError

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""Values of ``model.compile_mode`` (torch.compile's ``mode``)."""


def compiler_problem(device_type: str) -> str | None:
    """Why torch.compile cannot build code for ``device_type`` here (None: it can). On a CPU
    Inductor needs a C++ compiler (``$CXX``, else ``g++``); without one the first forward fails
    with a long traceback, so say it at start-up instead."""
    if device_type != "cpu":
        return None
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        return (f"torch.compile on a CPU needs a C++ compiler and {cxx!r} is not on PATH "
                "(install build-essential, or set model.compile=false)")
    return None


def compile_model(model: nn.Module, mode: str, device_type: str = "cpu") -> nn.Module:
    """Compile ``model``'s forward in place and return it (the same object)."""
    if mode not in COMPILE_MODES:
        raise ConfigError(f"config model.compile_mode: must be one of {' | '.join(COMPILE_MODES)}, got {mode!r}")
    why = compiler_problem(device_type)
    if why:
        raise ConfigError(f"config model.compile: {why}")
    model.compile(mode=mode)
    return model
