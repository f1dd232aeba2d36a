"""Model registry: built-in names, ``package.module:factory`` or ``path/to/file.py:factory``
returning an ``nn.Module``.

A factory is called as ``factory(num_classes=…, in_channels=…, **options)`` where options it does
not accept are dropped (so user factories may take only what they need). ``in_channels`` is the
first axis of one sample: (C, H, W) images give C, (C, L) sequences give C.
:func:`shape_hint` turns a model's failure on the first batch into a hint naming the likely fix.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hpctrain.errors import UserError

BUILTIN = {
    "digits_cnn": "hpctrain.models.small:SmallCNN",
    "mlp": "hpctrain.models.small:MLP",
    "resnet18": "hpctrain.models.resnet:resnet18",
    "resnet20": "hpctrain.models.resnet:resnet20",
    "resnet50": "hpctrain.models.resnet:resnet50",
    "signal_cnn": "hpctrain.models.small:SignalCNN",
}


class ModelError(UserError, ValueError):
    """The model name or factory is unusable (one line naming it)."""


def _is_file_spec(mod_name: str) -> bool:
    return mod_name.endswith(".py") or "/" in mod_name or os.sep in mod_name


def _import_file(path: str):
    """Import a ``.py`` file by path as its own module (registered in ``sys.modules`` under a name
    derived from the absolute path, so pickling and a second build find the same module)."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise ModelError(f"model.name: no such file {path!r} (give path/to/file.py:factory)")
    stem = os.path.splitext(os.path.basename(full))[0]
    name = f"hpctrain_user_model_{stem}_{hashlib.sha1(full.encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise ModelError(f"model.name: cannot import {path!r} (not a Python file)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:
        del sys.modules[name]
        raise ModelError(f"model.name: cannot import {path!r} ({type(exc).__name__}: {exc})") from None
    return mod


def resolve(spec: str) -> Callable[..., Any]:
    """``name``, ``module:attr`` or ``path/to/file.py:attr`` → the factory callable."""
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        raise ModelError(f"model.name: unknown model {spec!r} (built-in: {', '.join(BUILTIN)}; "
                         "or give package.module:factory or path/to/file.py:factory)")
    mod_name, _, attr = target.rpartition(":")
    if _is_file_spec(mod_name):
        mod = _import_file(mod_name)
    else:
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


def shape_hint(sample_shape, error: BaseException | str | None = None) -> str:
    """A hint naming the likely fix when a model fails on samples of ``sample_shape`` (one
    sample, no batch axis), or ``""``. The CLI builds the model with ``in_channels =
    sample_shape[0]``, so data without a channel axis makes a wrong model silently.

    Appended to the "model fails on input" error: ``f"…: {exc}{shape_hint(shape, exc)}"``.
    """
    shape = tuple(int(d) for d in sample_shape)
    text = str(error or "")
    dims = "x".join(str(d) for d in shape)
    if len(shape) == 1:
        (n,) = shape
        return (f"; hint: each sample has shape ({n},), so the model was built with in_channels={n} "
                f"(the first axis). A 1-D signal needs a channel axis: store the arrays as (N, 1, {n}) "
                f"(numpy: x[:, None, :]) and convert again")
    if len(shape) == 2 and ("channel" in text or "Expected" in text or "expected" in text):
        h, w = shape
        return (f"; hint: each sample has shape ({h}, {w}), so the model was built with in_channels={h}. "
                f"If that is one image or one {w}-long signal with {h} features per step, fine; "
                f"a single-channel image needs shape (1, {h}, {w}): store the arrays as (N, 1, {h}, {w}) "
                f"(numpy: x[:, None]) and convert again")
    if len(shape) == 3 and shape[-1] in (1, 3, 4) and shape[0] > 4:
        h, w, c = shape
        return (f"; hint: samples of shape {shape} look channels-last (H, W, C) = ({dims}); the model was "
                f"built with in_channels={h}. Store the arrays channels-first as (N, {c}, {h}, {w}) "
                f"(numpy: x.transpose(0, 3, 1, 2)) and convert again")
    if shape and "channels" in text:
        return (f"; hint: the model was built with in_channels={shape[0]}, the first axis of a sample "
                f"of shape {shape}; samples must be channels-first (C, …)")
    return ""


def check_model_output(model: torch.nn.Module, sample: torch.Tensor, num_classes: int, name: str) -> None:
    """One forward on two samples: the output must be (batch, num_classes) logits."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        try:
            out = model(sample)
        except Exception as exc:
            raise ModelError(f"model {name!r} fails on input of shape {tuple(sample.shape)}: {exc}"
                             f"{shape_hint(sample.shape[1:], exc)}") from None
    model.train(was_training)
    if not isinstance(out, torch.Tensor) or out.shape != (len(sample), num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(f"model {name!r} outputs {shape} for a batch of {len(sample)}, but the data has "
                         f"{num_classes} classes (expected ({len(sample)}, {num_classes}))")


__all__ = ["BUILTIN", "ModelError", "build_model", "check_model_output", "resolve", "shape_hint"]
