"""The installed names of kernels/ and data_tools/ (issue 24): ``hpctrain.kernels`` and
``hpctrain.data_tools``, never the bare top-level ``kernels`` (also a PyPI distribution's package)
or ``data_tools``. The folders stay at the checkout's top level; the links hpctrain/kernels and
hpctrain/data_tools put them inside the package for setuptools, PYTHONPATH and staging alike."""
import ast
import configparser
import os
import re
import subprocess
import sys

import numpy as np
from setuptools import find_packages

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BARE = {"kernels", "data_tools"}
# code that a test or script runs as a string (``python -c``), where the AST sees no import
_NAME = "(" + "|".join(sorted(BARE)) + r")\b(?![\w/-])"
IMPORT_LINE = re.compile(r"(?:^|[\"';]|\\n)\s*(?:from\s+" + _NAME.replace("(", "(?P<f>", 1)
                         + r"|import\s+(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)*" + _NAME.replace("(", "(?P<i>", 1) + ")",
                         re.MULTILINE)


def python_files():
    """Every Python file of the project, the links not followed (their targets are listed anyway)."""
    for top in ("hpctrain", "kernels", "data_tools", "tests", "examples", "scripts", "jobs", "docs"):
        for d, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            for f in files:
                path = os.path.join(d, f)
                if f.endswith(".py"):
                    yield path
                elif top == "scripts" and "." not in f:
                    with open(path, "rb") as fh:
                        if b"python" in fh.readline():
                            yield path


def bare_imports(path):
    """``(line, name)`` of each import of a bare top-level ``kernels``/``data_tools`` in ``path``."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    found = set()
    for node in ast.walk(ast.parse(text, path)):
        if isinstance(node, ast.Import):
            found |= {(node.lineno, a.name.split(".")[0]) for a in node.names if a.name.split(".")[0] in BARE}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in BARE:
                found.add((node.lineno, node.module.split(".")[0]))
    for m in IMPORT_LINE.finditer(text):
        group = "f" if m.group("f") else "i"
        found.add((text.count("\n", 0, m.start(group)) + 1, m.group(group)))
    return found


def test_no_file_imports_the_bare_top_level_names():
    files = list(python_files())
    assert len(files) > 250 and os.path.join(ROOT, "scripts", "probe-faults") in files
    offenders = [f"{os.path.relpath(p, ROOT)}:{line}: {name}" for p in files if p != os.path.abspath(__file__)
                 for line, name in sorted(bare_imports(p))]
    assert offenders == [], "import hpctrain.kernels / hpctrain.data_tools (or a relative import) instead"


def test_the_guard_sees_each_spelling(tmp_path):
    """The scan above cannot pass vacuously: each way of writing a bare import is caught."""
    spellings = {"import kernels": 1, "import data_tools.writer as w": 1, "from kernels._table import x": 1,
                 "from data_tools import cli": 1, 'run("import torch, kernels")': 1,
                 'CODE = "import kernels\\n"': 1, "from . import kernels": 0, "from hpctrain import kernels": 0,
                 "from hpctrain.data_tools.cli import main": 0, "# see kernels/_table.py": 0}
    for line, hits in spellings.items():
        p = tmp_path / "m.py"
        p.write_text(line + "\n")
        assert len(bare_imports(str(p))) == hits, line


def test_setup_cfg_installs_no_top_level_kernels_or_data_tools():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    assert cfg["options"]["packages"].strip() == "find:" and "package_dir" not in cfg["options"]
    find = cfg["options.packages.find"]
    split = lambda key: [s.strip() for s in find.get(key, "").replace("\n", ",").split(",") if s.strip()]  # noqa: E731
    packages = set(find_packages(where=ROOT, include=split("include"), exclude=split("exclude")))
    assert {p.split(".")[0] for p in packages} == {"hpctrain"}, sorted(packages)
    assert {"hpctrain.kernels", "hpctrain.data_tools"} <= packages
    for name in ("kernels", "data_tools"):
        link = os.path.join(ROOT, "hpctrain", name)
        assert os.path.islink(link) and os.readlink(link) == os.path.join("..", name)
    scripts = cfg["options.entry_points"]["console_scripts"]
    assert "hpctrain-data = hpctrain.data_tools.cli:main" in scripts


def test_installed_names_are_the_checkout_folders():
    import hpctrain.data_tools.sources
    import hpctrain.kernels
    assert os.path.realpath(hpctrain.kernels.__file__) == os.path.join(ROOT, "kernels", "__init__.py")
    assert os.path.realpath(hpctrain.data_tools.sources.__file__) == os.path.join(ROOT, "data_tools", "sources.py")
    assert not BARE & set(sys.modules), "a bare copy was imported beside the installed names"


def test_old_spelling_from_the_checkout_root_uses_the_installed_names(tmp_path):
    """``python -m data_tools`` (the old spelling) still converts from the checkout's root, and a
    plugin source given as ``module:name`` registers where that CLI looks it up (one copy of the
    registry, not a second one under the bare name)."""
    rows = np.random.default_rng(1).integers(0, 9, size=(12, 3))
    (tmp_path / "t.csv").write_text("a,b,label\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "data_tools", "convert", "--from", "examples.plugins.csv_source:csv",
                        str(tmp_path / "t.csv"), "--out", str(tmp_path / "out"), "--test-fraction", "0.25",
                        "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {tmp_path / 'out'}: train 9, test 3 samples"), r.stderr


OLD_PLUGIN = '''
import numpy as np
from data_tools.sources import from_arrays, source     # the bare name earlier versions documented


@source("ramp_old")
def ramp(src, **_):
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    return from_arrays({"train": (x[:16], np.arange(16) % 2), "test": (x[16:], np.arange(4) % 2)},
                       ["even", "odd"], "ramp_old")
'''


def test_a_plugin_importing_the_bare_name_registers_where_the_tools_look(tmp_path):
    """From a checkout, ``data_tools.x`` / ``kernels.x`` are the installed modules themselves
    (hpctrain.bare_names), so a plugin written against the old name still converts; without that,
    its source lands in a second registry and the tools answer "registers no source"."""
    (tmp_path / "old_plugin_for_test.py").write_text(OLD_PLUGIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
    r = subprocess.run([sys.executable, "-m", "hpctrain.data_tools", "convert", "--from", "old_plugin_for_test:ramp_old",
                        "-", "--out", str(tmp_path / "out"), "--no-progress"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {tmp_path / 'out'}: train 16, test 4 samples"), r.stderr
    same = ("import data_tools.sources, data_tools.readers, kernels.fp16_pack, hpctrain.data_tools.sources as s, "
            "hpctrain.data_tools.readers as r, hpctrain.kernels.fp16_pack as k; "
            "print(data_tools.sources is s, data_tools.readers.SOURCES is r.SOURCES, kernels.fp16_pack is k)")
    r = subprocess.run([sys.executable, "-c", same], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["True", "True", "True"], r.stderr
