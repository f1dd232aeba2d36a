"""Start-up refuses a job whose ranks disagree: a different model or config on one rank is named."""
import sys

from tests.integration.mpirun import mpirun

# A user model factory that builds a wider network on world rank 1 only (as a stale module on one
# node would). It is importable as odd_model:factory from the test's temporary directory.
FACTORY = '''
import os
from torch import nn

def factory(num_classes, in_channels):
    width = 24 if os.environ.get("OMPI_COMM_WORLD_RANK") == "1" else 16
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 8 * 8, width), nn.ReLU(), nn.Linear(width, num_classes))
'''


def test_model_differing_on_one_rank_is_refused_naming_it(tmp_path):
    (tmp_path / "odd_model.py").write_text(FACTORY)
    r, secs = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path / "run"), "--no-progress",
                         "--model", "odd_model:factory"], env={"PYTHONPATH": str(tmp_path)}, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "hpctrain: error: start-up check failed: the model on rank 1 differs from rank 0's" in r.stderr
    assert "'1.weight (24, 64) torch.float32' where the reference has '1.weight (16, 64) torch.float32'" in r.stderr
    assert "Traceback" not in r.stderr and secs < 60


def test_config_differing_on_one_rank_is_refused_naming_it(tmp_path):
    """MPMD launch: ranks 0-1 get lr 0.1, rank 2 gets 0.2; the majority is the reference."""
    common = ["-m", "hpctrain", "--run-dir", str(tmp_path), "--no-progress", "--batch-size", "48"]
    r, _ = mpirun(2, [*common, "--lr", "0.1", ":", "-n", "1", sys.executable, *common, "--lr", "0.2"], timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert ("the config on rank 2 differs from rank 0's: rank 2 has 'optim.lr = 0.2' "
            "where the reference has 'optim.lr = 0.1'") in r.stderr


FAILS_ON_RANK_1 = '''
import os
from torch import nn

def factory(num_classes, in_channels):
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
        raise ValueError("no weights on this node")
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 8 * 8, num_classes))
'''


def test_rank_failing_before_the_check_is_reported_without_a_hang(tmp_path):
    """Rank 1 fails building its model while rank 0 reaches the check: one line, status 2."""
    (tmp_path / "fails_model.py").write_text(FAILS_ON_RANK_1)
    r, secs = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path / "run"), "--no-progress",
                         "--model", "fails_model:factory"], env={"PYTHONPATH": str(tmp_path)}, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "hpctrain: error: rank 1: no weights on this node" in r.stderr
    assert "Traceback" not in r.stderr and secs < 60
