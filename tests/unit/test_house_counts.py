"""scripts/house-counts (issue 39's before/after measures) on a tiny generated tree whose counts are
known by construction: cycles hidden by a lazy and by a typing import, string references that climb
(one to its own floor), an eager cycle, a registered plugin whose name two files hold, a link into hpctrain/,
a tool in the group folder hpctrain/tools/ (a unit of its own; the group's __init__ is none) imported by the core.

The scaffolding names are taken from the script, not written here, so that this file adds nothing
to what the script counts in the real tests/. The last test reads this checkout itself: kernels/ and
data_tools/ have one home each, and the (config, data, data_tools) tie is gone (issue 39 item 2)."""
import ast
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "house-counts")


def load():
    loader = importlib.machinery.SourceFileLoader("house_counts", SCRIPT)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("house_counts", loader))
    loader.exec_module(module)
    return module


HC = load()
ALIAS, GONE = HC.SCAFFOLD_NAMES[:2]                 # one present in the fake tree, one absent
DUP = "def twin(a, b):\n" + "".join(f"    v{i} = a * {i} + b\n    print(v{i})\n" for i in range(5)) + "    return a\n"
FILES = {
    "hpctrain/__init__.py": "",
    "hpctrain/__main__.py": "from hpctrain.job import run\n",
    "hpctrain/errors.py": '"""Errors; "lars" is not here."""\nclass E(Exception):\n'
                          '    kind = "hpctrain.registry:Registry"\n',
    "hpctrain/registry.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from hpctrain.optim import OPTIMIZERS\n"
                            "class Registry:\n    def register(self, name):\n        return lambda f: f\n",
    "hpctrain/job.py": "from hpctrain.optim import make\n\n\ndef run():\n"
                       "    from hpctrain.config import opt_from_config\n"
                       "    return make, opt_from_config\n" + "# filler\n" * 120,
    "hpctrain/ty.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hpctrain.job import run\n",
    "hpctrain/config/__init__.py": 'from hpctrain.errors import E\nCHOICES = "hpctrain.optim:OPTIMIZERS"\n\n\n'
                                   "def opt_from_config(cfg):\n    return E\n",
    "hpctrain/optim/__init__.py": 'from hpctrain.registry import Registry\nfrom ..config import CHOICES\n'
                                  'OPTIMIZERS = Registry("optim.name", "optimiser")\n\n\n'
                                  '@OPTIMIZERS.register("lars")\ndef _lars():\n    return CHOICES\n',
    "hpctrain/optim/recipe.py": 'def row(name):\n    return 1 if name == "lars" else 0\n\n\n' + f"{ALIAS} = row\n",
    "hpctrain/data/__init__.py": 'CFG = "hpctrain.config"\n\n\ndef convert():\n    import hpctrain.data_tools.convert\n'
                                 "    return hpctrain\n",
    "hpctrain/bench/__init__.py": "\nfrom hpctrain.tools import sim\n",
    "hpctrain/bench/strategies.py": "def register(cls):\n    return cls\n",
    "hpctrain/bench/a.py": DUP,
    "hpctrain/bench/b.py": DUP,
    "data_tools/__init__.py": "from hpctrain.data import convert\n",
    "data_tools/convert.py": "from . import convert\n",
    "kernels/__init__.py": "X = 1\n",
    "hpctrain/tools/__init__.py": "",
    "hpctrain/tools/sim/__init__.py": "import hpctrain.bench\n",
    "tests/test_x.py": f"from hpctrain.optim.recipe import {ALIAS}\n",
    "tests/test_dup.py": DUP,
}


def nonblank(*prefixes):
    return sum(sum(1 for line in text.splitlines() if line.strip())
               for path, text in FILES.items() if path.startswith(prefixes))


@pytest.fixture
def tree(tmp_path):
    for path, text in FILES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    os.symlink("../data_tools", tmp_path / "hpctrain" / "data_tools")
    return tmp_path


def rows(root):
    return {key: value for _, section in HC.measure(str(root)) for key, _, value in section}


def test_counts_of_a_known_tree(tree, monkeypatch):
    monkeypatch.setenv("PATH", "")          # no `duplicates`: the row must say so, not fail
    r = rows(tree)
    assert (r["loose"], r["loose_all"], r["packages"], r["linked"], r["outside"], r["modules"]) == (4, 6, 5, 1, 1, 11)
    assert r["small"] == "3: errors.py, registry.py, ty.py" and r["small_floor0"] == 2
    assert r["hpctrain"] == f"{nonblank('hpctrain/')} lines, 16 files"
    assert r["hpctrain_followed"] == f"{nonblank('hpctrain/', 'data_tools/')} lines, 18 files"
    assert r["bench"] == f"{nonblank('hpctrain/bench/')} lines, 4 files"
    assert r["sim"] == "1 lines, 1 files" and r["tests"] == f"{nonblank('tests/')} lines, 2 files"
    assert r["largest"] == "hpctrain/job.py: 126 lines"
    assert r["hpctrain/bare_names.py"] == "absent" and r[ALIAS] == "found: 1 / 1"
    assert r[GONE] == "absent: 0 / 0" and r["strategies.register"] == "found: 1"
    assert r["links"] == "1: hpctrain/data_tools"
    assert r["plugin:optim.name:lars"] == "2: hpctrain/optim/__init__.py, hpctrain/optim/recipe.py"
    assert r["config_strings"] == "1: optim ×1" and r["config_importers"] == 2
    assert r["from_config"] == "1: opt_from_config"
    assert r["units"] == 11 and r["floors"] == 5
    assert r["by_floor"] == ("0: bench, data, errors, kernels, registry, tools.sim; 1: config, data_tools; "
                             "2: optim; 3: job; 4: ty")
    assert r["cycles"] == "3: (bench, tools.sim); (data, data_tools); (optim, registry)"
    assert r["cycles_strings"] == "3: (bench, tools.sim); (config, errors, optim, registry); (data, data_tools)"
    assert r["lazy"] == "2: data→data_tools lazy, job→config lazy"
    assert r["climbs"] == ("7: bench→tools.sim eager, config→optim string, data→data_tools lazy, data→config string, "
                           "errors→registry string, registry→optim typing, tools.sim→bench eager")
    assert r["core_to_tools"] == "1: bench→tools.sim eager"
    assert r["config_climbs"] == 2
    assert r["duplicates"].startswith("not usable")


@pytest.mark.skipif(not shutil.which("duplicates"), reason="the `duplicates` command is not on this machine")
def test_duplicate_pairs_within_the_library(tree):
    assert rows(tree)["duplicates"] == "1 (of 3 in the tree)"     # a~b; a~test and b~test are not


def test_main_prints_tables_and_refuses_a_root_without_hpctrain(tree, tmp_path_factory):
    env = {**os.environ, "PATH": ""}
    out = subprocess.run([sys.executable, SCRIPT, "--root", str(tree)], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "| climbs | 7: " in out.stdout and "not a git checkout" in out.stdout
    empty = tmp_path_factory.mktemp("empty")
    out = subprocess.run([sys.executable, SCRIPT, "--root", str(empty)], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and out.stderr.strip() == f"house-counts: {empty} has no hpctrain/ folder"


def test_this_checkout_has_one_home_for_the_tools_and_no_tie_through_them():
    """No link inside hpctrain/ and no import hook; kernels/ and data_tools/ counted once, as the
    installed packages kept outside hpctrain/; neither config nor data imports data_tools, and
    data_tools is on no import cycle (data_tools -> data stays: the tools write what data reads)."""
    scaffold = {key: value for key, _, value in HC.scaffold_rows(ROOT, HC.library(ROOT), {})}
    assert scaffold["links"] == "absent" and scaffold[HC.SCAFFOLD_FILES[0]] == "absent"
    assert HC.SCAFFOLD_FILES[0] == "hpctrain/bare_names.py"
    modules = {key: value for key, _, value in HC.module_rows(ROOT, {})}
    assert (modules["linked"], modules["outside"]) == (0, 2)
    mods = HC.library(ROOT)
    trees = {rel: ast.parse(HC.read(os.path.join(ROOT, rel)), rel) for rel in mods}
    units, edges, _, cycles, _ = HC.import_graph(mods, trees)
    assert {"config", "data", "data_tools", "kernels"} <= units
    assert [(s, k, r) for s, k, t, r in edges if t == "data_tools" and s in ("config", "data")] == []
    assert ("data_tools", "eager", "data") in {(s, k, t) for s, k, t, _ in edges}
    assert "data_tools" not in str(cycles), cycles
