"""``make test-gpu`` runs every GPU test file and lists the failed ones at the end, each file under
a launcher timeout with pytest's own timeout below it and above the jobs its tests launch; and
``make test`` runs the offline rehearsal. Checked with stand-ins for python and mpiexec."""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_FILES = ["tests/kernels/test_gpu.py", "tests/integration/test_gpu_job.py",
             "tests/mpi/test_gpu_sync.py", "tests/mpi/test_gpu_mixed_precision.py"]


def make(*args, **kw):
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, **kw)


def test_every_gpu_file_runs_and_the_failed_ones_are_listed(tmp_path):
    """A stand-in python fails tests/kernels/test_gpu.py and test_gpu_sync.py at -n 2 only; every
    file still runs (serially, then at -n 1 and -n 2), and the end lists both failures."""
    calls = tmp_path / "calls"
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\necho \"$OMPI_SIZE $*\" >> {calls}\n"
                  "case \"$*\" in *gpu_preflight.py*) exit 0;; *tests/kernels/test_gpu.py*) exit 1;; esac\n"
                  "case \"$OMPI_SIZE $*\" in \"2 \"*test_gpu_sync.py*) exit 1;; esac\nexit 0\n")
    mpiexec = tmp_path / "mpiexec"
    mpiexec.write_text("#!/bin/sh\nOMPI_SIZE=$2; export OMPI_SIZE; shift 2; exec \"$@\"\n")
    for f in (py, mpiexec):
        f.chmod(0o755)
    r = make("test-gpu", f"PY={py}", f"MPIEXEC={mpiexec}")
    assert r.returncode != 0
    assert r.stdout.strip().splitlines()[-1] == \
        "== [test-gpu] FAILED: tests/kernels/test_gpu.py tests/mpi/test_gpu_sync.py(-n2)", r.stdout
    ran = calls.read_text().splitlines()
    assert "gpu_preflight.py" in ran[0]
    runs = [(line.split()[0] if line[0] != " " else "", f) for line in ran[1:] for f in GPU_FILES if f in line]
    assert runs == [("", GPU_FILES[0]), ("", GPU_FILES[1]), ("1", GPU_FILES[2]), ("1", GPU_FILES[3]),
                    ("2", GPU_FILES[2]), ("2", GPU_FILES[3])]
    assert all("-p tests.gpu_no_skip" in line and "-m gpu" in line for line in ran[1:])


def test_all_passing_says_so_and_exits_0(tmp_path):
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\nexit 0\n")
    mpiexec = tmp_path / "mpiexec"
    mpiexec.write_text("#!/bin/sh\nshift 2; exec \"$@\"\n")
    for f in (py, mpiexec):
        f.chmod(0o755)
    r = make("test-gpu", f"PY={py}", f"MPIEXEC={mpiexec}")
    assert r.returncode == 0 and r.stdout.strip().endswith("== [test-gpu] every GPU test file passed"), r.stdout


def test_pytest_timeout_sits_between_the_jobs_a_test_launches_and_the_file_launcher():
    dry = make("-n", "test-gpu", "PY=python3", "MPIEXEC=mpiexec").stdout
    launchers = {int(x) for x in re.findall(r"timeout -k \d+ (\d+) ", dry)}
    pytest_timeouts = {int(x) for x in re.findall(r"--timeout=(\d+)", dry)}
    assert len(launchers) == 1 and len(pytest_timeouts) == 1, dry
    assert dry.count("timeout -k") == 2 and "--timeout=300" not in dry     # the serial and the MPI loop
    inner = [int(x) for f in GPU_FILES for x in re.findall(r"timeout\s*=\s*(\d+)", open(os.path.join(ROOT, f)).read())]
    assert max(inner) < min(pytest_timeouts) < min(launchers), (inner, pytest_timeouts, launchers)
    assert "PMIX_MCA_gds=hash" in dry


def test_make_test_runs_the_rehearsal():
    dry = make("-n", "test", "VENV=/nonexistent-venv-for-dry-run").stdout
    assert "test-gpu-rehearsal" in dry
    reh = make("-n", "test-gpu-rehearsal").stdout
    assert "scripts/gpu-rehearsal" in reh
