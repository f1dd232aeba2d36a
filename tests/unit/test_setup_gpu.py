"""`make setup` on GPU nodes: the CUDA-major choice (scripts/gpu_choice.py) and the set-up's dry run.

Nothing is installed: scripts/setup.sh with DRY_RUN=1 prints its choice and stops before any
package manager runs; a fake ``nvidia-smi`` on PATH stands in for a GPU node's.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_choice", ROOT / "scripts" / "gpu_choice.py")
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)

HEADER = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.65.06              Driver Version: 580.65.06      CUDA Version: {v}     |
|-----------------------------------------+------------------------+----------------------+
"""
LIST = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1b2c)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-3d4e)\n"


def fake_smi(version="12.4", listing=LIST):
    return lambda args: listing if args == ["-L"] else HEADER.format(v=version)


@pytest.mark.parametrize("major, want", [(12, ("cu126", "cuda")), (13, ("cu130", "cuda13")),
                                         (14, ("cu130", "cuda13"))])
def test_cuda_major_picks_the_torch_index_and_the_cupy_extra(major, want):
    assert gc.flavour_for(major) == want


def test_drivers_older_than_cuda_12_are_refused():
    with pytest.raises(gc.ChoiceError, match="supports CUDA 11.*GPU=0"):
        gc.flavour_for(11)


def test_parsing_nvidia_smi():
    assert gc.driver_cuda_version(HEADER.format(v="12.8")) == (12, 8)
    assert gc.driver_cuda_version("NVIDIA-SMI version  : 580.65\nCUDA Version        : 13.0\n") == (13, 0)
    assert gc.driver_cuda_version("no driver") is None
    assert gc.count_gpus(LIST) == 2 and gc.count_gpus("No devices were found\n") == 0


@pytest.mark.parametrize("version, flavour", [("12.2", "cu126"), ("12.9", "cu126"), ("13.0", "cu130"),
                                              ("13.1", "cu130")])
def test_auto_follows_the_driver(version, flavour):
    got = gc.choose("auto", "", fake_smi(version))
    assert got[0] == flavour and got[2] == f"GPU: 2 listed by nvidia-smi, driver CUDA {version}"


def test_switches_and_overrides():
    assert gc.choose("0", "", fake_smi())[0] == "cpu"                        # GPU=0 on a GPU node
    assert gc.choose("auto", "", lambda args: None) == ("cpu", "-", "no GPU: nvidia-smi not found")
    assert gc.choose("auto", "", fake_smi(listing=""))[:2] == ("cpu", "-")  # nvidia-smi, no GPU
    assert gc.choose("1", "13", lambda args: None) == ("cu130", "cuda13", "GPU=1, CUDA=13")
    assert gc.choose("1", "12", fake_smi("13.0"))[0] == "cu126"              # CUDA= beats the driver
    with pytest.raises(gc.ChoiceError, match="set CUDA=12 or CUDA=13"):
        gc.choose("1", "", lambda args: None)
    with pytest.raises(gc.ChoiceError, match="GPU=yes"):
        gc.choose("yes", "", lambda args: None)


def dry_run(tmp_path, path_dirs=(), **env):
    full = {k: v for k, v in os.environ.items() if k not in ("GPU", "CUDA", "MPI", "VENV")}
    full.update(DRY_RUN="1", VENV=str(tmp_path / "venv"), **env)
    full["PATH"] = os.pathsep.join([*map(str, path_dirs), full["PATH"]])
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, env=full,
                       timeout=60)
    assert not (tmp_path / "venv").exists()                                  # nothing installed
    return r


def smi_on_path(tmp_path, version, listing=LIST):
    d = tmp_path / "bin"
    d.mkdir()
    (d / "nvidia-smi").write_text(f"#!/bin/sh\nif [ \"$1\" = -L ]; then printf '%s' '{listing}'; exit 0; fi\n"
                                  f"printf '%s' '{HEADER.format(v=version)}'\n")
    (d / "nvidia-smi").chmod(0o755)
    return d


@pytest.mark.skipif(os.path.exists("/usr/bin/nvidia-smi"), reason="this machine has nvidia-smi")
def test_setup_keeps_the_cpu_wheel_here(tmp_path):
    r = dry_run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert "dry run: torch==2.13.0 (CPU wheel; no GPU: nvidia-smi not found)" in r.stdout
    assert "hpctrain[test,docs]" in r.stdout and "cupy-cuda13x" not in r.stdout
    r = dry_run(tmp_path, GPU="1")
    assert r.returncode == 2 and "set CUDA=12 or CUDA=13" in r.stderr


def test_setup_installs_with_uv_unless_told_pip(tmp_path, monkeypatch):
    monkeypatch.delenv("HPCTRAIN_INSTALLER", raising=False)
    assert "dry run: installed with uv" in dry_run(tmp_path, GPU="0").stdout
    assert "dry run: installed with pip" in dry_run(tmp_path, GPU="0", HPCTRAIN_INSTALLER="pip").stdout
    r = dry_run(tmp_path, GPU="0", HPCTRAIN_INSTALLER="conda")
    assert r.returncode == 2 and r.stderr == "[setup] HPCTRAIN_INSTALLER=conda: choose uv or pip\n"


@pytest.mark.parametrize("version, torch_pin, extras", [
    ("12.4", "torch==2.13.0+cu126", "hpctrain[test,docs,cuda]"),
    ("13.0", "torch==2.13.0+cu130", "hpctrain[docs,cuda13] pytest>=8"),
])
def test_setup_on_a_gpu_node_takes_the_cuda_build(tmp_path, version, torch_pin, extras):
    bin_dir = smi_on_path(tmp_path, version)
    r = dry_run(tmp_path, [bin_dir])
    assert r.returncode == 0, r.stderr
    assert f"dry run: {torch_pin} (CUDA build from https://download.pytorch.org/whl/{torch_pin[-5:]}" in r.stdout
    assert extras in r.stdout
    r = dry_run(tmp_path, [bin_dir], GPU="0")
    assert "torch==2.13.0 (CPU wheel; GPU=0)" in r.stdout and "hpctrain[test,docs]" in r.stdout
    r = dry_run(tmp_path, [bin_dir], MPI="mpich")
    assert torch_pin in r.stdout and "hpctrain[docs,cuda" in r.stdout


def test_a_node_whose_nvidia_smi_lists_no_gpu_keeps_the_cpu_wheel(tmp_path):
    r = dry_run(tmp_path, [smi_on_path(tmp_path, "12.4", listing="")])
    assert r.returncode == 0 and "CPU wheel; no GPU: nvidia-smi lists none" in r.stdout


@pytest.mark.parametrize("installed, flavour, want", [
    ("2.13.0+cu126", "cpu", True),      # GPU=0 rerun over a CUDA build: pip alone would keep it
    ("2.13.0+cu130", "cpu", True),
    ("2.13.0", "cpu", False), ("2.13.0+cpu", "cpu", False),
    ("2.13.0+cu126", "cu126", False),   # a CUDA pin names its label: pip replaces other builds
    ("2.13.0", "cu126", False),
])
def test_a_cpu_rerun_replaces_an_installed_cuda_build(installed, flavour, want):
    assert gc.replaces_installed(installed, flavour) is want
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_choice.py"), "--replaces", installed, flavour])
    assert (r.returncode == 0) is want
