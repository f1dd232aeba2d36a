"""The installed names of kernels/ and data_tools/ (issues 24, 39): ``hpctrain.kernels`` and
``hpctrain.data_tools``, never the bare top-level ``kernels`` (also a PyPI distribution's package)
or ``data_tools``. The folders at the checkout's top are their one home; setup.py's ``package_dir``
installs them under ``hpctrain`` (a wheel holds copies, an editable install maps the names to the
folders), with no link inside hpctrain/ and no import hook. A wheel and an editable install built
from a copy of this tree: tests/integration/test_install.py."""
import ast
import configparser
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BARE = {"kernels", "data_tools"}
# code that a test or script runs as a string (``python -c``), where the AST sees no import
_NAME = "(" + "|".join(sorted(BARE)) + r")\b(?![\w/-])"
IMPORT_LINE = re.compile(r"(?:^|[\"';]|\\n)\s*(?:from\s+" + _NAME.replace("(", "(?P<f>", 1)
                         + r"|import\s+(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)*" + _NAME.replace("(", "(?P<i>", 1) + ")",
                         re.MULTILINE)


def python_files():
    """Every Python file of the project."""
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


HOMES = {"hpctrain.kernels": "kernels", "hpctrain.data_tools": "data_tools"}


def test_build_maps_the_two_folders_and_nothing_links_into_hpctrain():
    tree = ast.parse(open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read())
    homes = next(ast.literal_eval(n.value) for n in tree.body
                 if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "HOMES")
    assert homes == HOMES
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    assert "packages" not in cfg["options"] and "package_dir" not in cfg["options"]   # setup.py says it once
    assert "hpctrain-data = hpctrain.data_tools.cli:main" in cfg["options.entry_points"]["console_scripts"]
    links = [os.path.join(d, x) for d, ds, fs in os.walk(os.path.join(ROOT, "hpctrain")) for x in ds + fs
             if os.path.islink(os.path.join(d, x))]
    assert links == [] and not os.path.exists(os.path.join(ROOT, "hpctrain", "bare_names.py"))


def test_installed_names_are_the_checkout_folders():
    """From a checkout after ``make setup`` (the editable install's finder maps the two names)."""
    import hpctrain.data_tools.sources
    import hpctrain.kernels
    assert os.path.realpath(hpctrain.kernels.__file__) == os.path.join(ROOT, "kernels", "__init__.py")
    assert os.path.realpath(hpctrain.data_tools.sources.__file__) == os.path.join(ROOT, "data_tools", "sources.py")
    assert not BARE & set(sys.modules), "a bare copy was imported beside the installed names"


def test_plugin_source_from_the_checkout_root_registers_where_the_cli_looks(tmp_path):
    """``python -m hpctrain.data_tools convert --from module:name`` from the checkout's root: the
    plugin registers in the one registry the CLI reads."""
    rows = np.random.default_rng(1).integers(0, 9, size=(12, 3))
    (tmp_path / "t.csv").write_text("a,b,label\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "hpctrain.data_tools", "convert", "--from",
                        "examples.plugins.csv_source:csv", str(tmp_path / "t.csv"), "--out", str(tmp_path / "out"),
                        "--test-fraction", "0.25", "--no-progress"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {tmp_path / 'out'}: train 9, test 3 samples"), r.stderr
