"""Model registry: built-in names, or any ``package.module:factory`` returning an ``nn.Module``.

A factory is called as ``factory(num_classes=…, in_channels=…, **options)`` where options it does
not accept are dropped (so user factories may take only what they need).
"""
from __future__ import annotations

import importlib
import inspect

from torch import nn

BUILTIN = {
    "digits_cnn": "hpctrain.models.small:SmallCNN",
    "resnet18": "hpctrain.models.resnet:resnet18",
    "resnet20": "hpctrain.models.resnet:resnet20",
    "resnet50": "hpctrain.models.resnet:resnet50",
}


class ModelError(ValueError):
    """The model name or factory is unusable (one line naming it)."""


def resolve(spec: str):
    """``name`` or ``module:attr`` → the factory callable."""
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ModelError(f"model.name: unknown model {spec!r} (built-in: {', '.join(BUILTIN)}; "
                         "or give package.module:factory)")
    mod_name, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ModelError(f"model.name: cannot import {mod_name!r} ({exc})") from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ModelError(f"model.name: module {mod_name!r} has no attribute {attr!r}") from None


def build_model(spec: str, *, num_classes: int, in_channels: int, **options) -> nn.Module:
    factory = resolve(spec)
    kwargs = {"num_classes": num_classes, "in_channels": in_channels, **options}
    try:
        params = inspect.signature(factory).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}
    except (TypeError, ValueError):
        pass
    model = factory(**kwargs)
    if not isinstance(model, nn.Module):
        raise ModelError(f"model.name: factory {spec!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


__all__ = ["BUILTIN", "ModelError", "build_model", "resolve"]
