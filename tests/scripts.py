"""Import a file of ``scripts/`` (no ``.py``, not a package) as a module, for its tests."""
import importlib.machinery
import importlib.util
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(file_name: str, module_name: str) -> types.ModuleType:
    """``scripts/<file_name>`` as module ``module_name``, registered in ``sys.modules`` (dataclasses
    look their module up there)."""
    loader = importlib.machinery.SourceFileLoader(module_name, os.path.join(ROOT, "scripts", file_name))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(module_name, loader))
    sys.modules[module_name] = module
    loader.exec_module(module)
    return module
