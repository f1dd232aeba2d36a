"""End to end, at 1 rank (in process) and the smallest data: work once written is never lost or
mixed up (legs of another batch size, corrupt checkpoints), and a non-finite result never ends
"done"."""
import json
import os
import subprocess
import sys

import h5py
import numpy as np

from hpctrain.ops import checkpoint as ck
from tests.integration.inprocess import run_cli, run_data_tools
from tests.integration.mpirun import hpctrain_lines

ARGS = ["--no-progress", "--set", "train.eval_every=0"]


def run(capsys, run_dir, *extra):
    """A one-rank run in this process (tests/integration/inprocess.py): the launch is not what is tested."""
    return run_cli(capsys, *ARGS, "--run-dir", str(run_dir), *extra)


def ours(r):
    return hpctrain_lines(r.stderr)


def status(run_dir):
    r = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(run_dir)], capture_output=True, text=True,
                       timeout=60)
    return r.returncode, r.stdout.strip()


def events(run_dir):
    return [json.loads(x)["event"] for x in open(os.path.join(run_dir, "metrics.jsonl"))]


def test_a_resume_with_another_batch_is_a_new_leg_that_auto_resume_and_pruning_keep(tmp_path, capsys):
    """The issue's recipe, scaled down: leg 0 at batch 64 to step 30 (22 steps an epoch);
    leg 1 at batch 128 (11 an epoch) restarts at step 15, lower, and goes to 22; a third start
    continues leg 1 (not leg 0's higher-numbered step 30), and pruning kept leg 1's."""
    d = tmp_path / "run"
    r = run(capsys, d, "--max-steps", "30", "--set", "ckpt.every_steps=10")
    assert r.returncode == 0, r.stderr[-3000:]
    r = run(capsys, d, "--max-steps", "22", "--batch-size", "128", "--set", "ckpt.every_steps=3", "--resume", "auto")
    assert r.returncode == 0, r.stderr[-3000:]
    leg_lines = [x for x in ours(r) if "resume changes the global batch 64 -> 128" in x]
    assert len(leg_lines) == 1 and "leg 1 of this run" in leg_lines[0], ours(r)
    r = run(capsys, d, "--max-steps", "24", "--batch-size", "128", "--set", "ckpt.every_steps=3", "--resume", "auto")
    assert r.returncode == 0, r.stderr[-3000:]
    where = d / "checkpoints"
    assert f"resumed from {where}/ckpt-000000022-leg1.pt: step 22" in r.stderr, ours(r)
    assert not any("resume changes" in x for x in ours(r))         # same batch: the same leg goes on
    names = [os.path.basename(p) for _, p in ck.list_checkpoints(str(where))]
    assert names == ["ckpt-000000021-leg1.pt", "ckpt-000000022-leg1.pt", "ckpt-000000024-leg1.pt"]
    header = ck.read_header(str(where / names[-1]))
    assert header["leg"] == 1 and header["samples_seen"] == 30 * 64 + (24 - 15) * 128
    assert events(d).count("config") == 3 and events(d)[-1] == "summary"    # appended, never cleared


def test_auto_resume_refuses_when_no_checkpoint_verifies(tmp_path, capsys):
    d = tmp_path / "run"
    r = run(capsys, d, "--max-steps", "6", "--set", "ckpt.every_steps=3")
    assert r.returncode == 0, r.stderr[-3000:]
    log_before = open(d / "metrics.jsonl").read()
    for _, path in ck.list_checkpoints(str(d / "checkpoints")):
        with open(path, "r+b") as fh:
            fh.seek(-1, os.SEEK_END)
            fh.write(b"\0" if fh.read(1) != b"\0" else b"\1")
    r = run(capsys, d, "--max-steps", "9", "--resume", "auto")     # a start-up refusal
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [x for x in ours(r) if x.startswith("hpctrain: error:")]
    assert len(errors) == 1 and "no checkpoint of this run" in errors[0], ours(r)
    assert "ckpt-000000003.pt.corrupt" in errors[0] and "ckpt-000000006.pt.corrupt" in errors[0]
    assert sorted(os.listdir(d / "checkpoints")) == ["ckpt-000000003.pt.corrupt", "ckpt-000000006.pt.corrupt"]
    assert open(d / "metrics.jsonl").read() == log_before                  # the evidence kept
    code, line = status(d)
    assert code == 2 and "no checkpoint of this run" in line


def nan_data(tmp_path, capsys):
    """An npz with a NaN in one test sample, converted with --allow-nonfinite; its index in the
    test split (the converter may reorder)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8)).astype(np.float32)
    xt = rng.normal(size=(32, 8)).astype(np.float32)
    xt[5, 3] = np.nan
    np.savez(tmp_path / "n.npz", x=x, y=(x[:, 0] > 0).astype(np.int64), x_test=xt,
             y_test=(xt[:, 0] > 0).astype(np.int64))
    out = tmp_path / "shards"
    r = run_data_tools(capsys, "convert", "--no-progress", "--from", "npz", str(tmp_path / "n.npz"), "--allow-nonfinite",
                       "--out", str(out))
    assert r.returncode == 0, r.stderr
    index = json.load(open(out / "index.json"))
    rows = np.concatenate([h5py.File(out / e["file"])["x"][:] for e in index["splits"]["test"]["shards"]])
    return out, int(np.flatnonzero(np.isnan(rows).any(axis=1))[0])


def test_a_nan_in_the_test_split_is_not_done(tmp_path, capsys):
    data, bad = nan_data(tmp_path, capsys)
    d = tmp_path / "run"
    r = run(capsys, d, "--data", str(data), "--model", "mlp", "--batch-size", "32", "--epochs", "1")
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [x for x in ours(r) if x.startswith("hpctrain: error:")]
    assert len(errors) == 1 and "non-finite result on the test split" in errors[0], ours(r)
    assert f"sample {bad} of the test split" in errors[0]
    assert "summary" not in events(d)
    code, line = status(d)
    assert code == 2 and line.startswith("hpctrain: failed: non-finite result on the test split")
    assert ck.list_checkpoints(str(d / "checkpoints"))                    # the work is kept
