"""Which torch build and CuPy extra `make setup` installs: the CPU wheel, or a CUDA build for the driver.

    python3 scripts/gpu_choice.py      ->  "<flavour> <extra> <reason>" on one line, e.g.
                                           "cpu - no GPU: nvidia-smi not found"
                                           "cu126 cuda GPU: 4 listed by nvidia-smi, driver CUDA 12.4"

Reads ``GPU`` (``auto`` (default): a GPU when ``nvidia-smi -L`` lists one; ``1``: a GPU build,
``0``: the CPU wheel) and ``CUDA`` (``12`` | ``13``: the CUDA major, instead of the one
``nvidia-smi`` reports for the driver). The driver's CUDA major picks the PyTorch wheel index and
the CuPy wheel: 12.x drivers run ``cu126`` torch and ``cupy-cuda12x`` (the ``cuda`` extra), 13.x
and newer ``cu130`` and ``cupy-cuda13x`` (the ``cuda13`` extra); older drivers cannot run
torch 2.13's CUDA builds. Standard library only: it runs before the virtual environment exists.
Exit status 2 with one line on stderr when ``GPU=1`` has no CUDA major to go by.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

FLAVOURS = {12: ("cu126", "cuda"), 13: ("cu130", "cuda13")}
"""CUDA major -> (PyTorch wheel index / local version, setup.cfg extra with the matching CuPy)."""


class ChoiceError(ValueError):
    """No CUDA build can be chosen (the message says why and what to set)."""


def driver_cuda_version(smi_text: str) -> tuple[int, int] | None:
    """``(major, minor)`` of "CUDA Version: 12.4" in ``nvidia-smi``'s header (or
    ``nvidia-smi --version``'s "CUDA Version : 13.0"); None if absent."""
    m = re.search(r"CUDA Version\s*:\s*(\d+)\.(\d+)", smi_text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def count_gpus(smi_list_text: str) -> int:
    """GPUs in ``nvidia-smi -L`` output ("GPU 0: NVIDIA H100 ... (UUID: ...)", one a line)."""
    return len(re.findall(r"^GPU \d+:", smi_list_text, flags=re.M))


def flavour_for(major: int) -> tuple[str, str]:
    """``(torch flavour, extra)`` for a driver's CUDA major: 12 -> cu126, 13 and newer -> cu130
    (a newer driver runs older CUDA builds)."""
    if major < min(FLAVOURS):
        raise ChoiceError(f"the driver supports CUDA {major}, older than the CUDA {min(FLAVOURS)} "
                          "builds of torch 2.13: update the driver, or set GPU=0 for the CPU wheel")
    return FLAVOURS[min(major, max(FLAVOURS))]


def choose(gpu: str = "auto", cuda: str = "", smi=None) -> tuple[str, str, str]:
    """``(flavour, extra, reason)``; ``flavour`` "cpu" with extra "-" for the CPU wheel.

    ``smi(args) -> str | None`` runs ``nvidia-smi args`` (None: not installed, or it failed).
    """
    gpu = (gpu or "auto").strip().lower()
    if gpu not in ("auto", "0", "1"):
        raise ChoiceError(f"GPU={gpu}: expected auto, 0 or 1")
    if gpu == "0":
        return "cpu", "-", "GPU=0"
    smi = smi or run_nvidia_smi
    listed = smi(["-L"])
    n_gpus = count_gpus(listed or "")
    if gpu == "auto" and not n_gpus:
        return "cpu", "-", "no GPU: " + ("nvidia-smi not found" if listed is None else "nvidia-smi lists none")
    why = "GPU=1" if gpu == "1" else f"GPU: {n_gpus} listed by nvidia-smi"
    if cuda:
        if not cuda.strip().isdigit():
            raise ChoiceError(f"CUDA={cuda}: expected the CUDA major version, 12 or 13")
        major, source = int(cuda), f"CUDA={cuda}"
    else:
        version = driver_cuda_version(smi([]) or "")
        if version is None:
            raise ChoiceError(f"{why}, but nvidia-smi reports no driver CUDA version: "
                              "set CUDA=12 or CUDA=13 (the CUDA major the driver supports)")
        major, source = version[0], f"driver CUDA {version[0]}.{version[1]}"
    flavour, extra = flavour_for(major)
    return flavour, extra, f"{why}, {source}"


def run_nvidia_smi(args: list[str]) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else ""


def replaces_installed(installed: str, flavour: str) -> bool:
    """Must an installed torch (its version, e.g. ``2.13.0+cu126``) be removed before the
    ``flavour`` build goes in? pip sees ``2.13.0+cu126`` as satisfying ``torch==2.13.0`` (a pin
    without a local label matches any), so a CPU install over a CUDA build would keep the CUDA
    build; a CUDA pin (``==2.13.0+cu126``) names its label, and pip replaces other builds."""
    local = installed.partition("+")[2]
    return flavour == "cpu" and local not in ("", "cpu")


def main() -> int:
    if sys.argv[1:2] == ["--replaces"]:     # setup.sh: exit 0 when the installed torch must go
        return 0 if replaces_installed(sys.argv[2], sys.argv[3]) else 1
    try:
        flavour, extra, reason = choose(os.environ.get("GPU", "auto"), os.environ.get("CUDA", ""))
    except ChoiceError as exc:
        print(f"[setup] {exc}", file=sys.stderr)
        return 2
    print(flavour, extra, reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
