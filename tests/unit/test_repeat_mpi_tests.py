"""scripts/repeat-mpi-tests counts a failure however the launcher interleaved the ranks' output."""
import importlib.machinery
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script():
    path = os.path.join(ROOT, "scripts", "repeat-mpi-tests")
    loader = importlib.machinery.SourceFileLoader("repeat_mpi_tests", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("repeat_mpi_tests", loader))
    loader.exec_module(module)
    return module


def test_a_rank_line_joined_to_progress_dots_is_counted():
    log = ("....F[rank 1] tests/mpi/test_x.py::test_a FAILED in call\n[rank 1] E  assert 4 == 6\n"
           "   [100%][rank 0] tests/mpi/test_x.py::test_a FAILED in call\n"
           "[rank 0] tests/mpi/test_y.py::test_b FAILED in setup\n")
    assert load_script().FAILED_LINE.findall(log) == [
        ("1", "tests/mpi/test_x.py::test_a", "call"), ("0", "tests/mpi/test_x.py::test_a", "call"),
        ("0", "tests/mpi/test_y.py::test_b", "setup")]
