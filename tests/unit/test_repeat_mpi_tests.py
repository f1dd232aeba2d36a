"""scripts/repeat-mpi-tests counts a failure however the launcher interleaved the ranks' output."""
from tests.scripts import load_script


def test_a_rank_line_joined_to_progress_dots_is_counted():
    log = ("....F[rank 1] tests/mpi/test_x.py::test_a FAILED in call\n[rank 1] E  assert 4 == 6\n"
           "   [100%][rank 0] tests/mpi/test_x.py::test_a FAILED in call\n"
           "[rank 0] tests/mpi/test_y.py::test_b FAILED in setup\n")
    assert load_script("repeat-mpi-tests", "repeat_mpi_tests").FAILED_LINE.findall(log) == [
        ("1", "tests/mpi/test_x.py::test_a", "call"), ("0", "tests/mpi/test_x.py::test_a", "call"),
        ("0", "tests/mpi/test_y.py::test_b", "setup")]
