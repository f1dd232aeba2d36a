"""A checkout's bare ``data_tools`` and ``kernels`` as the very modules of their installed names.

The two folders install as :mod:`hpctrain.data_tools` and :mod:`hpctrain.kernels`, but from a
checkout's root Python also finds them by their bare names, which earlier versions documented
(``from data_tools.sources import source`` in a plugin). Imported that way each file would run a
second time as another module, with registries of its own: a plugin source would register where
the tools never look. :func:`become` makes the bare package and each of its submodules the
installed name's module object instead; the bare ``kernels`` and ``data_tools`` use it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


class _SameModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``bare.x`` as the already imported ``real.x`` (``__main__`` excepted: ``python -m``
    must run that file itself)."""

    def __init__(self, bare: str, real: str):
        self.bare, self.real = bare, real

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.bare + ".") and not fullname.endswith(".__main__"):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(self.real + spec.name[len(self.bare):])

    def exec_module(self, module) -> None:
        """Nothing to run: the module was made under its installed name."""


def become(bare: str, real: str) -> None:
    """Make ``sys.modules[bare]`` (the package being imported) ``real``, and its submodules too."""
    if not any(isinstance(f, _SameModule) and f.bare == bare for f in sys.meta_path):
        sys.meta_path.insert(0, _SameModule(bare, real))
    sys.modules[bare] = importlib.import_module(real)
    for name, module in list(sys.modules.items()):      # the submodules the package imported already
        if name.startswith(real + "."):
            sys.modules.setdefault(bare + name[len(real):], module)
