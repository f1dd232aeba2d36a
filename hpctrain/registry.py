"""One plugin seam: a named table of factories per kind (strategy, codec, update algorithm,
optimiser, data source).

A plugin is one file that decorates its class or function with ``@REG.register("name")``; the
decorator records it and sets its ``name``. The registry is a read-only mapping (``name ->
factory``, in registration order), so config validation reads the accepted names from it
(``choices="module:NAME"`` in :mod:`hpctrain.config`) and a new plugin needs no config edit.
:meth:`Registry.get` refuses an unknown name in one line naming the kind, the name and the
choices. Importing this module registers nothing.
"""
from __future__ import annotations

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

    def get(self, name: str) -> T:
        """The factory called ``name``; a ValueError names the key, ``name`` and the choices."""
        try:
            return self._entries[name]
        except KeyError:
            names = sorted(self._entries) if self.sort_choices else list(self._entries)
            raise ValueError(f"{self.key}: unknown {self.noun} {name!r} "
                             f"(choose from {', '.join(names)})") from None

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.key!r}: {', '.join(self._entries)})"


def _where(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
