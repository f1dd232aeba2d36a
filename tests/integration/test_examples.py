"""The examples run as their docstrings say, at -n 2, on small inputs made here."""
import os

import numpy as np

from hpctrain.data_tools.cli import main as data_tools
from tests.integration.mpirun import mpirun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def convert(npz, out):
    """In process: the examples' launches are what is tested, not the converter's."""
    assert data_tools(["convert", "--no-progress", "--from", "npz", str(npz), "--out", str(out)]) == 0
    return str(out)


def test_train_own_model(tmp_path):
    rng = np.random.default_rng(1)
    y = rng.integers(0, 3, 600)
    x = (rng.normal(0, 0.5, (600, 2, 4)) + y[:, None, None]).astype(np.float32)
    np.savez(tmp_path / "mine.npz", x=x, y=y)
    data = convert(tmp_path / "mine.npz", tmp_path / "mine")
    r, _ = mpirun(2, [os.path.join(ROOT, "examples", "train_own_model.py"), "--data", data, "--epochs", "3",
                      "--ranks-per-node", "1"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    acc = float(r.stdout.strip().splitlines()[-1].split()[-1])
    assert acc > 0.9, r.stdout


def test_resnet20_cifar_smoke(tmp_path):
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "c.npz", x=rng.integers(0, 255, (96, 3, 32, 32), dtype=np.uint8), y=rng.integers(0, 10, 96))
    data = convert(tmp_path / "c.npz", tmp_path / "c")
    r, _ = mpirun(2, [os.path.join(ROOT, "examples", "resnet20_cifar.py"), "--data", data, "--epochs", "1",
                      "--max-steps", "2", "--batch-per-rank", "8"], timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "after BN polishing" in r.stdout
