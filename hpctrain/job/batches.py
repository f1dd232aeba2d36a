"""Batches on their way to the model: the wait for each timed as the "data" phase, each moved to
the device and made the model's input there (the CLI job, :mod:`hpctrain.job`)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch

from hpctrain.data import gpudecode
from hpctrain.ops.metrics import StepTimer

Item = TypeVar("Item")


def to_device(x: torch.Tensor, y: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch on ``device`` (asynchronous from pinned memory; on the CPU the tensors themselves;
    decoded there already: ordered after its decode, :func:`hpctrain.data.gpudecode.take`)."""
    x = gpudecode.take(x)
    if device.type == "cpu":
        return x, y
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def device_batches(batches, device: torch.device, prep=None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each ``(x, y)`` of ``batches`` on ``device`` (:func:`to_device`), ``x`` then made the model's
    input there by ``prep`` (a raw batch's :class:`~hpctrain.data.BatchPrep`; None: ready as is).
    Training, evaluation and Final Polishing all take their batches through here."""
    for x, y in batches:
        x, y = to_device(x, y, device)
        yield (x if prep is None else prep(x)), y


def timed_batches(batches: Iterable[Item], timer: StepTimer) -> Iterator[Item]:
    """Yield from ``batches``, timing each wait as the "data" phase."""
    it = iter(batches)
    while True:
        with timer.span("data"):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item
