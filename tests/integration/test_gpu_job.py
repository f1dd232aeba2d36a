"""The CLI job on a GPU (``-m gpu``; skipped without a CUDA device: "needs a CUDA device").

Written for GPU nodes; not run on the CPU-only machines it was written on. Two ranks may share
one GPU (``cuda:<local rank mod visible GPUs>``).
"""
import json
import os

import pytest
import torch

from hpctrain.ops import checkpoint as ck
from tests.integration.mpirun import mpirun

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

GPU = ["--set", "train.device=cuda"]
STAGED = {"HPCTRAIN_CUDA_AWARE_MPI": "0"}   # device buckets staged, whatever the MPI library is


def run(n, run_dir, *extra, env=None):
    r, _ = mpirun(n, ["-m", "hpctrain", "--no-progress", "--run-dir", str(run_dir), *extra], timeout=600,
                  env=env)
    return r


def summary_of(run_dir):
    return json.loads(open(os.path.join(run_dir, "metrics.jsonl")).readlines()[-1])


@pytest.mark.parametrize("n", [1, 2])
def test_default_job_on_gpu_reaches_target(tmp_path, n):
    """Staged (forced, whatever the MPI) on two ranks; one rank keeps gradients on the GPU."""
    r = run(n, tmp_path, *GPU, env=STAGED)
    assert r.returncode == 0, r.stderr[-3000:]
    where = "staged from cuda" if n > 1 else "(one rank: no copies)"
    assert "device cuda:" in r.stdout and where in r.stdout, r.stdout[:2000]
    summary = summary_of(tmp_path)
    assert summary["event"] == "summary" and summary["world_size"] == n
    assert summary["test_accuracy"] >= 0.95, summary


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_default_job_on_gpu_with_each_codec_and_overlap(tmp_path, compression):
    r = run(2, tmp_path, *GPU, "--set", f"comm.compression={compression}", "--set", "comm.overlap=true",
            "--set", "comm.ranks_per_node=1", "--set", "polish.bn_recompute=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert summary_of(tmp_path)["test_accuracy"] >= 0.95


def test_gpu_checkpoint_resumes_on_gpu_and_on_cpu(tmp_path):
    k = 15
    first = tmp_path / "gpu"
    r = run(2, first, *GPU, "--max-steps", str(k))
    assert r.returncode == 0, r.stderr[-3000:]
    (step, path), *_ = reversed(ck.list_checkpoints(os.path.join(first, "checkpoints")))
    state = ck.decode(ck.read_file(path)[1])
    assert step == k and all(t.device.type == "cpu" for t in state["trainer"]["model"].values())
    r = run(2, first, *GPU, "--max-steps", str(2 * k), "--set", "ckpt.resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {path}: step {k}" in r.stderr
    summary = summary_of(first)
    assert summary["start_step"] == k and summary["steps"] == 2 * k
    # the GPU checkpoint on the CPU: map_location is the CPU, load_state_dict copies into place
    r = run(1, tmp_path / "cpu", "--set", "train.device=cpu", "--max-steps", str(2 * k),
            "--set", f"ckpt.resume={path}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {path}: step {k}" in r.stderr
    _, resumed = ck.list_checkpoints(os.path.join(tmp_path / "cpu", "checkpoints"))[-1]
    for t in ck.decode(ck.read_file(resumed)[1])["trainer"]["model"].values():
        assert torch.isfinite(t.float()).all()
