"""``--model path/to/file.py:factory`` trains, from any working directory. The conversions and
one-rank jobs run in process (tests/integration/inprocess.py): what is tested is the path given
relative to the working directory, not the launch."""
import json

import numpy as np

from tests.integration.inprocess import run_cli, run_data_tools

MODEL = '''
import torch
def make(num_classes, in_channels):
    """(batch, C, L) sequences: one conv over the channel axis, then a linear head."""
    return torch.nn.Sequential(torch.nn.Conv1d(in_channels, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))
'''


def test_model_file_path_factory_trains_one_step(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "train.npz", x=rng.normal(size=(64, 1, 16)).astype(np.float32), y=rng.integers(0, 3, 64))
    np.savez(tmp_path / "test.npz", x=rng.normal(size=(16, 1, 16)).astype(np.float32), y=rng.integers(0, 3, 16))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "conv.py").write_text(MODEL)
    r = run_data_tools(capsys, "convert", "--from", "npz", "train.npz", "test.npz", "--out", "shards", "--no-progress",
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "train 64, test 16" in r.stdout
    r = run_cli(capsys, "--model", "models/conv.py:make", "--data", "shards", "--run-dir", "run", "--no-progress",
                "--max-steps", "1", "--batch-size", "16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert lines[-1]["event"] == "summary" and lines[-1]["steps"] == 1, lines[-1]
    assert lines[0]["config"]["model"]["name"] == "models/conv.py:make"


def test_startup_line_and_the_channel_axis_hint(tmp_path, capsys):
    """(N, 40) arrays make samples of shape (40,): the model fails, and the one line says why;
    a run states its effective lr and why at start-up."""
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "flat.npz", x=rng.normal(size=(80, 40)).astype(np.float32), y=rng.integers(0, 2, 80))
    (tmp_path / "conv.py").write_text(MODEL)
    r = run_data_tools(capsys, "convert", "--from", "npz", "flat.npz", "--out", "flat", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    args = ["--data", "flat", "--run-dir", "run", "--no-progress", "--max-steps", "1", "--batch-size", "16"]
    r = run_cli(capsys, *args, "--model", "conv.py:make", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "hint: each sample has shape (40,)" in r.stderr and "(N, 1, 40)" in r.stderr, r.stderr
    (tmp_path / "lin.py").write_text("import torch\ndef make(num_classes):\n"
                                     "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))\n")
    r = run_cli(capsys, *args, "--model", "lin.py:make", "--lr", "0.2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "lr 0.0125 = 0.2 x 16/256 (optim.scale_lr; set optim.scale_lr=false to use 0.2 as given)" in r.stdout


def test_1d_samples_without_a_channel_axis_get_a_hint(tmp_path, capsys):
    """(N, 16) arrays → samples (16,) → in_channels=16 → a Conv1d model fails: the one error line
    names the fix, a channel axis (N, 1, 16)."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "flat.npz", x=rng.normal(size=(64, 16)).astype(np.float32), y=rng.integers(0, 3, 64))
    (tmp_path / "conv.py").write_text(MODEL)
    r = run_data_tools(capsys, "convert", "--from", "npz", "flat.npz", "--out", "shards", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run_cli(capsys, "--model", "conv.py:make", "--data", "shards", "--run-dir", "run", "--no-progress",
                "--max-steps", "1", "--batch-size", "16", cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "in_channels=16" in lines[0] and "(N, 1, 16)" in lines[0], r.stderr
