"""`pip install` of hpctrain into a user's environment keeps the torch and mpi4py it already has;
the wheel and an editable install carry kernels/ and data_tools/ as ``hpctrain.kernels`` and
``hpctrain.data_tools`` only (setup.py's ``package_dir``; issue 39).

Offline and quick: hpctrain's wheel is built from this tree, and the user's environment is a
fresh venv holding metadata-only stand-ins for torch 2.5.0 and mpi4py 4.1.0. Newer stand-ins
(torch 2.13.0, the version `make setup` installs, and mpi4py 4.1.2) sit beside stand-ins for the
other dependencies in the only package source pip may use, so an exact pin would show up as a
replacement of the user's torch.
"""
import base64
import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLED = {"torch": "2.5.0", "mpi4py": "4.1.0"}
AVAILABLE = {"torch": "2.13.0", "mpi4py": "4.1.2", "numpy": "2.0.0", "h5py": "3.10.0",
             "scikit-learn": "1.3.0", "tqdm": "4.66.0", "matplotlib": "3.8.0", "pillow": "10.0.0", "xxhash": "3.0.0",
             "simplejpeg": "1.8.0"}


def fake_wheel(out_dir, name: str, version: str) -> str:
    """A wheel with only its metadata: enough for pip to resolve and install it."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hpctrain-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    path = os.path.join(out_dir, f"{dist}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for name_, text in files.items():
            z.writestr(name_, text)
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def pip(target_python, *args, check=True):
    """This venv's pip acting on ``target_python``'s environment, offline (without PYTHONPATH,
    which would show the user's environment this checkout's packages)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "pip", "--python", target_python, "--disable-pip-version-check",
                        *args], capture_output=True, text=True, timeout=180, env=env)
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """This tree, copied: setuptools leaves build/ and *.egg-info beside the sources it builds."""
    src = tmp_path_factory.mktemp("src") / "hpctrain"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "runs",
                                                             "site", "__pycache__"))
    return src


@pytest.fixture(scope="module")
def hpctrain_wheel(tmp_path_factory, source_copy):
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(out), str(source_copy)], capture_output=True, text=True, timeout=180)
    if r.returncode != 0 and "No module named" in r.stderr:
        pytest.skip(f"cannot build the wheel here: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = [f for f in os.listdir(out) if f.startswith("hpctrain-")]
    return str(out / wheel)


def test_install_keeps_the_users_torch_and_mpi4py(tmp_path, hpctrain_wheel):
    env_dir, index = tmp_path / "user-env", tmp_path / "index"
    index.mkdir()
    venv.create(env_dir, with_pip=False)
    python = str(env_dir / "bin" / "python")
    users = tmp_path / "users"
    users.mkdir()
    pip(python, "install", "-q", "--no-index",
        *[fake_wheel(str(users), n, v) for n, v in INSTALLED.items()])
    for n, v in AVAILABLE.items():
        fake_wheel(str(index), n, v)

    report = tmp_path / "report.json"
    pip(python, "install", "--dry-run", "--no-index", "--find-links", str(index), "--report", str(report),
        hpctrain_wheel)
    planned = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert "hpctrain" in planned, sorted(planned.items())
    assert "torch" not in planned and "mpi4py" not in planned, f"pip would replace the user's build: {planned}"

    pip(python, "install", "-q", "--no-index", "--find-links", str(index), hpctrain_wheel)
    listed = {d["name"].lower(): d["version"] for d in json.loads(pip(python, "list", "--format", "json").stdout)}
    assert listed["torch"] == "2.5.0" and listed["mpi4py"] == "4.1.0", listed
    assert pip(python, "check", check=False).returncode == 0     # 2.5.0 satisfies hpctrain's range


HOMES = {"hpctrain.kernels": "kernels", "hpctrain.data_tools": "data_tools"}
IMPORTS = ("import sys, hpctrain.kernels as k, hpctrain.data_tools.synthetic as s; "
           "print(k.__file__, s.__file__, 'kernels' in sys.modules or 'data_tools' in sys.modules)")


def _without_pythonpath():
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_the_wheel_holds_the_two_folders_under_hpctrain_only(hpctrain_wheel, tmp_path):
    """A regular install: hpctrain/kernels and hpctrain/data_tools hold every file of the top-level
    folders, there is no top-level kernels/ or data_tools/ (``kernels`` is also a PyPI distribution's
    package), and the unpacked wheel imports both names (and runs ``python -m hpctrain.data_tools``)
    with the checkout off the path."""
    names = zipfile.ZipFile(hpctrain_wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))} == {"hpctrain"}
    for home, folder in HOMES.items():
        wanted = {f"{folder}/{f}" for f in os.listdir(os.path.join(ROOT, folder)) if f.endswith(".py")}
        held = {n[len("hpctrain/"):] for n in names if n.startswith(home.replace(".", "/") + "/")}
        assert wanted == held, home
    unpacked = tmp_path / "site"
    zipfile.ZipFile(hpctrain_wheel).extractall(unpacked)        # a pure wheel's install is its unpacked files
    env = dict(_without_pythonpath(), PYTHONPATH=str(unpacked))
    as_main = "; import runpy; sys.argv[1:] = ['--help']; runpy.run_module('hpctrain.data_tools', run_name='__main__')"
    found, usage = _run([sys.executable, "-c", IMPORTS + as_main], cwd=tmp_path, env=env).split("\n", 1)
    kernels_file, synthetic_file, bare = found.split()
    assert kernels_file == str(unpacked / "hpctrain" / "kernels" / "__init__.py")
    assert synthetic_file == str(unpacked / "hpctrain" / "data_tools" / "synthetic.py") and bare == "False"
    assert usage.startswith("usage: python -m hpctrain.data_tools"), usage     # python -m hpctrain.data_tools


def test_an_editable_install_maps_the_names_to_the_folders(source_copy, tmp_path):
    """``make setup``'s editable install, built from the copy and put first on a bare interpreter's
    path (-S: this venv's own editable install would answer first): setuptools' editable finder
    maps the two names to the copy's top-level folders."""
    _run([sys.executable, "-c", f"from setuptools import build_meta as b; b.build_editable({str(tmp_path)!r})"],
         cwd=source_copy, env=_without_pythonpath())
    (wheel,) = tmp_path.glob("hpctrain-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    boot = (f"import site; site.addsitedir({str(tmp_path / 'site')!r}); "
            + "".join(f"site.addsitedir({p!r}); " for p in site.getsitepackages()) + IMPORTS)
    kernels_file, synthetic_file, bare = _run([sys.executable, "-S", "-c", boot], cwd=tmp_path,
                                              env=_without_pythonpath()).split()
    assert kernels_file == str(source_copy / "kernels" / "__init__.py")
    assert synthetic_file == str(source_copy / "data_tools" / "synthetic.py") and bare == "False"
