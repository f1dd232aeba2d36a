"""``make test``'s order, from its dry run: the side stream (lint, the docs, the MPICH venv,
Slurm's start, the GPU rehearsal) runs beside the serial leg's parallel part, and the tests marked
``alone`` (wall times against bounds) only after that stream has been waited for, so nothing of it
(a first run's MPICH build) runs beside them; the MPI legs and Slurm's jobs come after both."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dry_test() -> list[str]:
    r = subprocess.run(["make", "--no-print-directory", "-n", "test", "VENV=/nonexistent-venv-for-dry-run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def first(lines: list[str], needle: str, start: bool = False) -> int:
    hits = [i for i, line in enumerate(lines) if (line.startswith(needle) if start else needle in line)]
    assert hits, f"{needle!r} not in make -n test"
    return hits[0]


def test_the_alone_tests_run_after_the_side_stream_and_before_the_mpi_legs():
    lines = dry_test()
    parallel = first(lines, '-m "not alone"')
    side_printed = first(lines, "== [test] beside the serial leg (status", start=True)  # after the wait
    alone = first(lines, "-m alone tests/unit")
    assert parallel < side_printed < alone
    for side_part in ("ruff check", "mkdocs build", "MPI=mpich VENV=.venv-mpich", "scripts/slurm/start.sh",
                      "scripts/gpu-rehearsal"):
        assert side_printed < first(lines, side_part) < alone, side_part
    for later in ("--only-mpi", "tests/integration/test_ops_slurm.py", "mpiexec.mpich -n 2"):
        assert alone < first(lines, later), later
