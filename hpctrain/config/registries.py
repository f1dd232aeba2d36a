"""One plugin seam: a named table of factories per kind (strategy, codec, update algorithm,
optimiser, data source).

A plugin is one file that decorates its class or function with ``@REG.register("name")``; the
decorator records it and sets its ``name``. The registry is a read-only mapping (``name ->
factory``, in registration order), so config validation reads the accepted names from it
(the schema, :mod:`hpctrain.job.config`, holds each registry as a field's ``choices``) and a new
plugin needs no config edit.
:meth:`Registry.get` refuses an unknown name in one line naming the kind, the name and the
choices. Importing this module registers nothing.

A plugin outside the package is chosen as ``"package.module:name"`` (as ``model.name`` names a
factory): the registry imports the module, which registers ``name``, then looks it up; so one
file anywhere on ``sys.path`` is selectable from a config file or ``--set`` without any edit here.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Factories of one kind by name. ``key`` is the config key the name is given in
    (``comm.compression``), ``noun`` what one entry is called in an error (``compression``)."""

    def __init__(self, key: str, noun: str, *, sort_choices: bool = True) -> None:
        self.key, self.noun, self.sort_choices = key, noun, sort_choices
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: make ``obj`` selectable as ``name`` and set ``obj.name = name``. A name
        taken by another object is a ValueError (two plugins must not shadow each other)."""
        def deco(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and old is not obj:
                raise ValueError(f"{self.key}: {self.noun} {name!r} is registered twice "
                                 f"({_where(old)} and {_where(obj)})")
            obj.name = name             # type: ignore[attr-defined]
            self._entries[name] = obj
            return obj
        return deco

    def get(self, name: str) -> T:  # type: ignore[override]  # raises where Mapping.get returns None
        """The factory called ``name`` (or ``module:name``, imported first); a ValueError names
        the key, ``name`` and the choices."""
        problem = self.plugin_problem(name)
        if problem:
            raise ValueError(f"{self.key}: {problem}")
        if name in self._entries:
            return self._entries[name]
        if ":" in name:
            return self._entries[name.partition(":")[2]]
        names = sorted(self._entries) if self.sort_choices else list(self._entries)
        raise ValueError(f"{self.key}: unknown {self.noun} {name!r} (choose from {', '.join(names)})")

    def plugin_problem(self, name: str) -> str | None:
        """Why ``module:name`` selects nothing (the module does not import, or registers no
        ``name`` here), or None; None for a plain name too."""
        if ":" not in name or name in self._entries:
            return None
        module, _, short = name.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"plugin {name!r}: cannot import {module!r} ({exc})"
        if short not in self._entries:
            return f"plugin {name!r}: {module} registers no {self.noun} {short!r} here"
        return None

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __getitem__(self, name: str) -> T:
        try:
            return self.get(name)
        except ValueError as exc:
            raise KeyError(name) from exc

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._entries or (":" in name and self.plugin_problem(name) is None))

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.key!r}: {', '.join(self._entries)})"


def _where(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
