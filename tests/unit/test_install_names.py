"""The installed names of kernels/ and data_tools/ (issues 24, 39): ``hpctrain.kernels`` and
``hpctrain.data_tools``, never the bare top-level ``kernels`` (also a PyPI distribution's package)
or ``data_tools``. The folders at the checkout's top are their one home; setup.py's ``package_dir``
installs them under ``hpctrain`` (a wheel holds copies, an editable install maps the names to the
folders), with no link inside hpctrain/ and no import hook."""
import ast
import configparser
import os
import re
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

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
BUILD_INPUTS = ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "hpctrain", "kernels", "data_tools")


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


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """What the build reads, copied (a build in the checkout would leave build/ and egg-info there)."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    return src


def _without_pythonpath():
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


IMPORTS = ("import sys, hpctrain.kernels as k, hpctrain.data_tools.synthetic as s; "
           "print(k.__file__, s.__file__, 'kernels' in sys.modules or 'data_tools' in sys.modules)")


def test_a_wheel_installs_the_folders_under_hpctrain_only(source_copy, tmp_path):
    """A regular install: the wheel holds hpctrain/kernels and hpctrain/data_tools and no top-level
    kernels/ or data_tools/, and its unpacked copy imports both (and runs ``python -m
    hpctrain.data_tools``) with the checkout off the path."""
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", str(tmp_path / "dist"), str(source_copy)], env=_without_pythonpath())
    (wheel,) = (tmp_path / "dist").glob("hpctrain-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))} == {"hpctrain"}
    for home, folder in HOMES.items():
        wanted = {f"{folder}/{f}" for f in os.listdir(os.path.join(ROOT, folder)) if f.endswith(".py")}
        held = {n[len("hpctrain/"):] for n in names if n.startswith(home.replace(".", "/") + "/")}
        assert wanted == held, home
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)          # a pure wheel's install is its unpacked files
    env = dict(_without_pythonpath(), PYTHONPATH=str(site))
    kernels_file, synthetic_file, bare = _run([sys.executable, "-c", IMPORTS], cwd=tmp_path, env=env).split()
    assert kernels_file == str(site / "hpctrain" / "kernels" / "__init__.py")
    assert synthetic_file == str(site / "hpctrain" / "data_tools" / "synthetic.py") and bare == "False"
    assert _run([sys.executable, "-m", "hpctrain.data_tools", "--help"], cwd=tmp_path, env=env).startswith(
        "usage: python -m hpctrain.data_tools")


def test_an_editable_install_maps_the_names_to_the_folders(source_copy, tmp_path):
    """``make setup``'s editable install, built from a copy and put first on a bare interpreter's path
    (-S: this venv's own editable install would otherwise answer first): the names import from
    the copy's top-level folders."""
    _run([sys.executable, "-c", f"from setuptools import build_meta as b; b.build_editable({str(tmp_path)!r})"],
         cwd=source_copy, env=_without_pythonpath())
    (wheel,) = tmp_path.glob("hpctrain-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    import site as site_module
    boot = (f"import site; site.addsitedir({str(tmp_path / 'site')!r}); "
            + "".join(f"site.addsitedir({p!r}); " for p in site_module.getsitepackages()) + IMPORTS)
    kernels_file, synthetic_file, bare = _run([sys.executable, "-S", "-c", boot], cwd=tmp_path,
                                              env=_without_pythonpath()).split()
    assert kernels_file == str(source_copy / "kernels" / "__init__.py")
    assert synthetic_file == str(source_copy / "data_tools" / "synthetic.py") and bare == "False"


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
