"""Update algorithms: how averaged gradients become parameter updates (``update.algorithm``).

========  ===========================================================================
ssgd      synchronous SGD: every step waits for the gradient mean (the default)
odsgd     one-step delay SGD (Xu et al., arXiv:2005.06728): the allreduce of step t
          overlaps step t+1's forward/backward, which runs on locally updated weights.
          Use when communication is a large share of the step (slow or shared
          network, many ranks); ``update.odsgd.warmup_steps`` plain SSGD steps first.
========  ===========================================================================

Both derive from :class:`UpdateAlgorithm` (:mod:`hpctrain.update.base`: ``step``, ``finish``,
``close``, ``state_dict``/``load_state_dict``, and the overflow / loss-scaler decision written
once). Both stop on non-finite numbers the same way: :class:`NonFiniteError` (a ``UserError``:
one line, status 2 from the CLI) on every rank at the same step, naming the step and the
rank(s), unless a loss scaler skipped the step (:mod:`hpctrain.update.guard`).
The config table is ``[update]``, after this package; the gradient sync is ``trainer.grad_sync``.
"""
from __future__ import annotations

from hpctrain.update.base import ALGORITHMS, StepResult, UpdateAlgorithm
from hpctrain.update.guard import NonFiniteError
from hpctrain.update.odsgd import ODSGD
from hpctrain.update.ssgd import SSGD


def create(name: str, model, optimizer, grad_sync, **kwargs) -> UpdateAlgorithm:
    """Build the algorithm registered as ``name``; a ValueError names the choices."""
    return ALGORITHMS.get(name)(model, optimizer, grad_sync, **kwargs)


__all__ = ["ALGORITHMS", "SSGD", "ODSGD", "StepResult", "NonFiniteError", "UpdateAlgorithm", "create"]
