"""`pip install` of hpctrain into a user's environment keeps the torch and mpi4py it already has.

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
def hpctrain_wheel(tmp_path_factory):
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "hpctrain"
    # built from a copy: setuptools leaves build/ and *.egg-info beside the sources it builds
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "runs",
                                                             "site", "__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(out), str(src)], capture_output=True, text=True, timeout=180)
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
