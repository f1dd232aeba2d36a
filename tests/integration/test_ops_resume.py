"""Checkpoint/restart of the CLI job: bit-identical resume (stopped, or a rank killed with SIGKILL,
mid-epoch), kill during a write, another world size, and the merged timeline of a real run.

Every run trains with augmentation (pad-crop and flip on digits): a resumed epoch must crop and
flip its remaining batches exactly as the uninterrupted run did (issue 33: they once took the
draws of the epoch's first batches, so only epoch-boundary resumes matched)."""
import json
import os

import pytest
import torch

from hpctrain.ops import checkpoint as ck
from tests.integration.inprocess import run_cli
from tests.integration.mpirun import mpirun

K = 15                  # not a multiple of the 22 steps per epoch: the resume lands mid-epoch
ARGS = ["-m", "hpctrain", "--no-progress", "--set", "train.eval_every=0", "--set", "data.augment=true"]


def run(n, run_dir, *extra, env=None):
    r, secs = mpirun(n, [*ARGS, "--run-dir", str(run_dir), *extra], timeout=300, env=env)
    return r


def run_here(capsys, run_dir, *extra):
    """A one-rank run in this process (tests/integration/inprocess.py): the launch is not what is tested."""
    return run_cli(capsys, *ARGS[2:], "--run-dir", str(run_dir), *extra)


def final_state(run_dir):
    (step, path), *_ = reversed(ck.list_checkpoints(os.path.join(run_dir, "checkpoints")))
    return step, ck.decode(ck.read_file(path)[1])


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """2K steps in one go, on 2 ranks, with the timeline on."""
    d = tmp_path_factory.mktemp("straight")
    r = run(2, d, "--max-steps", str(2 * K), "--set", "run.timeline=true")
    assert r.returncode == 0, r.stderr[-3000:]
    return d


def test_resume_is_bit_identical(straight, tmp_path):
    r = run(2, tmp_path, "--max-steps", str(K))
    assert r.returncode == 0, r.stderr[-3000:]
    r = run(2, tmp_path, "--max-steps", str(2 * K), "--set", "ckpt.resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {tmp_path}/checkpoints/{ck.checkpoint_name(K)}: step {K}, epoch 0, step {K}" in r.stderr
    step_a, a = final_state(straight)
    step_b, b = final_state(tmp_path)
    assert step_a == step_b == 2 * K and b["epoch"] == 1 and b["step_in_epoch"] == 2 * K - 22
    for key, ta in a["trainer"]["model"].items():
        assert torch.equal(ta, b["trainer"]["model"][key]), key          # bit for bit
    oa, ob = a["trainer"]["optimizer"]["state"], b["trainer"]["optimizer"]["state"]
    assert oa.keys() == ob.keys() and all(torch.equal(oa[i]["momentum_buffer"], ob[i]["momentum_buffer"]) for i in oa)
    summary = json.loads(open(tmp_path / "metrics.jsonl").readlines()[-1])
    assert summary["event"] == "summary" and summary["start_step"] == K and summary["steps"] == 2 * K


def assert_same_weights(run_a, run_b, step):
    (step_a, a), (step_b, b) = final_state(run_a), final_state(run_b)
    assert step_a == step_b == step
    for key, ta in a["trainer"]["model"].items():
        assert torch.equal(ta, b["trainer"]["model"][key]), key          # bit for bit


def test_rank_killed_mid_epoch_then_resume_auto_is_bit_identical(straight, tmp_path):
    """``kill -9`` of rank 0 while it writes the step-16 checkpoint (the other rank goes down with
    the job), then ``--resume auto`` from step 8 of epoch 0: the straight run's weights at 2K."""
    every = ["--set", "ckpt.every_steps=8"]           # when checkpoints are written; not the training
    r, _ = mpirun(2, [*ARGS, "--run-dir", str(tmp_path), "--max-steps", str(2 * K), *every],
                  env={"HPCTRAIN_INJECT_KILL": "checkpoint:2"}, timeout=300)
    assert r.returncode != 0
    r = run(2, tmp_path, "--max-steps", str(2 * K), *every, "--resume", "auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {tmp_path}/checkpoints/{ck.checkpoint_name(8)}: step 8, epoch 0, step 8" in r.stderr
    assert_same_weights(straight, tmp_path, 2 * K)


def test_timeline_has_every_rank(straight):
    trace = json.load(open(straight / "timeline.json"))
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for rank in (0, 1):
        names = [e["name"] for e in spans if e["pid"] == rank]
        for phase in ("data", "forward", "backward", "allreduce", "optimizer", "checkpoint"):
            assert phase in names, (rank, phase)
        assert names.count("forward") == 2 * K
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)


def test_other_world_size_and_batch_replans(tmp_path, straight, capsys):
    """The 2-rank checkpoint at step 30 (global batch 64, 22 steps an epoch) continues on 1 rank
    with global batch 128 (11 steps an epoch): 8 steps of 64 into epoch 1 → step 4 of epoch 1."""
    path = os.path.join(straight, "checkpoints", ck.checkpoint_name(2 * K))
    r = run_here(capsys, tmp_path, "--max-steps", "18", "--batch-size", "128", "--set", f"ckpt.resume={path}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "is from 2 ranks, this run has 1" in r.stderr
    assert f"resumed from {path}: step 15, epoch 1, step 4 of 11 in the epoch" in r.stderr
    summary = json.loads(open(tmp_path / "metrics.jsonl").readlines()[-1])
    assert summary["start_step"] == 15 and summary["steps"] == 18 and summary["world_size"] == 1


def test_kill_during_checkpoint_write_then_resume(tmp_path, capsys):
    env = {"HPCTRAIN_INJECT_KILL": "checkpoint:2"}     # SIGKILL half-way through the second write
    r, _ = mpirun(1, [*ARGS, "--run-dir", str(tmp_path), "--max-steps", "12", "--set", "ckpt.every_steps=4"],
                  env=env, timeout=300)
    assert r.returncode != 0
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names[0].startswith(".ckpt-000000008.pt.tmp-") and names[1:] == [ck.checkpoint_name(4)]
    header, _ = ck.read_file(str(tmp_path / "checkpoints" / ck.checkpoint_name(4)))   # checksum verifies
    assert header["step"] == 4
    r = run_here(capsys, tmp_path, "--max-steps", "12", "--set", "ckpt.every_steps=4", "--set", "ckpt.resume=auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {tmp_path}/checkpoints/{ck.checkpoint_name(4)}" in r.stderr
    assert [s for s, _ in ck.list_checkpoints(str(tmp_path / "checkpoints"))] == [4, 8, 12]
    assert not any(".tmp-" in n for n in os.listdir(tmp_path / "checkpoints"))   # stray file pruned
