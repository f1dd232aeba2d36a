"""How ``scripts/gpu-check`` launches its steps, on the CPU: a step that overruns is ended with its
whole process group (TERM, then KILL), so no rank outlives it to hold the GPU for the next step;
the launch environment is complete outside make; pytest's own timeout stays below its step's;
the preflight runs before any step, stops the check for a piece no step can do without, and a
missing optional module skips only the step that needs it."""
import json
import os
import sys
import time

import pytest

from tests.scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu-check")
gpu_check = load_script("gpu-check", "gpu_check_launch")

# A step that hangs on purpose, as mpiexec does with its ranks: the leader starts a child that
# outlives a TERM (it notes the TERM, then keeps sleeping) and a grandchild that sleeps; every
# pid goes to a file, the group id too.
HANG = """
import os, signal, subprocess, sys, time
out = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", '''
import os, signal, subprocess, sys, time
def noted(*_):
    open(sys.argv[1] + ".term", "a").write("TERM\\\\n")
signal.signal(signal.SIGTERM, noted)
g = subprocess.Popen(["sleep", "300"])
open(sys.argv[1], "a").write(f"{os.getpid()} {g.pid}\\\\n")
while True:
    time.sleep(0.1)
''', out])
open(out, "a").write(f"{os.getpid()} {os.getpgid(0)}\\n")
while True:
    time.sleep(0.1)
"""


def live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_step_over_its_timeout_ends_its_whole_process_group(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "GRACE_S", 1.0)
    pids_file = tmp_path / "pids"
    step = gpu_check.Step("hangs", 60, [sys.executable, "-c", HANG, str(pids_file)])
    with open(tmp_path / "log", "w") as log:
        t0 = time.monotonic()
        status, _, seconds = gpu_check.run_step(step, 5.0, log)
    assert status == "timeout" and seconds < 20 and time.monotonic() - t0 < 20
    rows = [line.split() for line in pids_file.read_text().splitlines()]
    assert len(rows) == 2, rows          # the leader's line and the child's, both written in time
    pids = {int(x) for row in rows for x in row}
    leader, pgid = next((int(a), int(b)) for a, b in rows if int(b) == int(a))
    assert leader == pgid                # the step led a group of its own
    assert (tmp_path / "pids.term").read_text() == "TERM\n"    # TERM came first, KILL ended it
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(live(p) for p in pids):
        time.sleep(0.05)
    assert not [p for p in pids if live(p)]
    assert not gpu_check.group_alive(pgid)


def test_a_step_that_ends_by_itself_keeps_its_status_and_output(tmp_path):
    code = "import sys; print('RESULT {\"a\": 1}'); print('on stderr', file=sys.stderr); sys.exit(3)"
    with open(tmp_path / "log", "w") as log:
        status, note, _ = gpu_check.run_step(gpu_check.Step("s", 20, [sys.executable, "-c", code]), 20, log)
    assert status == "failed (exit 3)" and json.loads(note) == {"a": 1}
    assert "on stderr" in (tmp_path / "log").read_text()


def test_launch_env_sets_gds_hash_and_oversubscription_outside_make():
    env = gpu_check.launch_env({"PATH": "/bin"})
    assert env["PMIX_MCA_gds"] == "hash" and env["OMPI_MCA_rmaps_base_oversubscribe"] == "1"
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["PATH"] == "/bin"
    assert gpu_check.launch_env({"PMIX_MCA_gds": "shmem2"})["PMIX_MCA_gds"] == "shmem2"   # the caller's wins


@pytest.mark.parametrize("cpu", [False, True])
def test_pytest_timeout_stays_below_its_step_timeout(cpu):
    pytest_steps = [s for s in gpu_check.steps("py", "mpiexec", "/tmp/out", cpu) if "pytest" in s.argv]
    assert len(pytest_steps) == 3 and all(s.pytest for s in pytest_steps)
    for step in pytest_steps:
        assert not [a for a in step.argv if a.startswith("--timeout")], step.argv   # setup.cfg's 300 s replaced
        for timeout_s in (step.timeout_s, 40.0):        # its own, and one shortened to fit the budget
            argv = gpu_check.pytest_argv(step, timeout_s)
            given = [int(a.split("=")[1]) for a in argv if a.startswith("--timeout=")]
            assert len(given) == 1 and 0 < given[0] <= timeout_s - gpu_check.PYTEST_MARGIN_S, (step.name, argv)


def test_a_missing_optional_module_skips_only_the_step_that_needs_it():
    steps = gpu_check.steps("py", "mpiexec", "/tmp/out", False)
    assert {s.needs for s in steps if s.needs} == set(gpu_check.OPTIONAL) == {"cupy", "torchvision"}
    missing = {"cupy": "CuPy: not installed", "torchvision": "torchvision: not installed"}
    skipped = {s.name: gpu_check.plan(s, 540, False, missing)[1] for s in steps}
    assert skipped["kernels vs CPU references"] == "cupy is not installed (only this step needs it)"
    assert skipped["GPU JPEG decode vs Pillow"] == "torchvision is not installed (only this step needs it)"
    assert [n for n, why in skipped.items() if why] == ["kernels vs CPU references", "GPU JPEG decode vs Pillow"]
    assert gpu_check.DRY_KEYS == tuple(s.key for s in steps if s.key and not s.gpu_only)


def stub_python(tmp_path, missing: dict):
    """A stand-in for the steps' Python that answers the preflight with ``missing`` and fails
    anything else (no step may run)."""
    py = tmp_path / "python"
    answer = json.dumps({"missing": missing, "found": {}})
    py.write_text(f"#!/bin/sh\ncase \"$1\" in *gpu_preflight.py) echo '{answer}'; exit 2;; esac\n"
                  "echo STEP RAN >> \"$(dirname \"$0\")/ran\"; exit 1\n")
    py.chmod(0o755)
    return str(py)


def test_preflight_names_every_missing_piece_and_stops_before_any_step(tmp_path, capsys):
    missing = {"h5py": "h5py: the Python module h5py is not installed",
               "libmpi": "libmpi: mpi4py cannot load an MPI library (libmpi.so.40: cannot open)",
               "cupy": "cupy: the Python module cupy is not installed"}
    out = tmp_path / "out"
    assert gpu_check.main([str(out), "--python", stub_python(tmp_path, missing), "--mpiexec", "mpiexec"]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [f"gpu-check: preflight: missing {line}" for line in missing.values()]
    assert lines[3].startswith("gpu-check: stopped before any step: h5py, libmpi missing")
    assert not (tmp_path / "ran").exists()
    assert json.loads((out / "summary.json").read_text())["steps"] == []


def test_a_python_that_cannot_run_the_preflight_stops_the_check(tmp_path, capsys):
    assert gpu_check.main([str(tmp_path / "out"), "--python", str(tmp_path / "no-python")]) == 2
    assert "stopped before any step: " in capsys.readouterr().out
