"""A run made to collapse on purpose (issue 38): LAMB on the BN-free digits CNN with a relative
step that grows through the warm-up until the net, which had learned, dies. Every rank stops at
the same step with status 6 and one line on rank 0; ``hpctrain status`` says collapsed; with
``train.on_collapse=warn`` the same run prints the line once and finishes."""
import json
import subprocess
import sys

from tests.integration.inprocess import run_cli
from tests.integration.mpirun import ENV, hpctrain_lines, mpirun

COLLAPSING = ["--no-progress", "--set", "model.batchnorm=false", "--set", "optim.name=lamb", "--set", "optim.lr=0.15",
              "--set", "optim.scale_lr=false", "--set", "optim.warmup_epochs=3", "--set", "optim.schedule=constant",
              "--set", "optim.weight_decay=0", "--set", "train.collapse_steps=30"]


def records(run_dir):
    with open(run_dir / "metrics.jsonl") as fh:
        return [json.loads(line) for line in fh]


def test_a_collapsed_run_ends_with_status_6_and_one_line(tmp_path):
    r, _ = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path), "--epochs", "8", *COLLAPSING], timeout=240)
    assert r.returncode == 6, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in hpctrain_lines(r.stderr, "") if "training collapsed" in ln]
    assert len(lines) == 1, r.stderr[-2000:]                      # rank 0 alone
    assert lines[0].startswith("hpctrain: error: training collapsed: the loss (smoothed) fell to ")
    assert "ln C = 2.303" in lines[0] and "optim.warmup_epochs" in lines[0] and "lr 0.15 as given" in lines[0]
    recs = records(tmp_path)
    collapsed = [x for x in recs if x["event"] == "collapsed"]
    assert len(collapsed) == 1 and not any(x["event"] == "summary" for x in recs)
    c = collapsed[0]
    assert c["lowest_loss"] <= 0.5 * 2.303 and c["turned_step"] < c["chance_since"] <= c["step"]
    assert c["step"] - c["chance_since"] + 1 == 30
    epochs = [x for x in recs if x["event"] == "epoch"]
    assert min(x["train_loss"] for x in epochs) < 1.0              # it had learned
    assert epochs[-1]["step"] <= c["step"] + 1                      # stopped at the verdict, not at the end
    st = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(tmp_path)], capture_output=True, text=True,
                        timeout=60, env={**ENV, **__import__("os").environ})
    assert st.returncode == 6 and st.stdout.startswith("hpctrain: collapsed: training collapsed"), st.stdout


def test_on_collapse_warn_prints_once_and_finishes(tmp_path, capsys):
    """One rank, in process (tests/integration/inprocess.py): the verdict is the same code at any size."""
    r = run_cli(capsys, "--run-dir", str(tmp_path), "--epochs", "5", *COLLAPSING, "--set", "train.on_collapse=warn")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("hpctrain: warning: training collapsed") == 1, r.stderr[-2000:]
    assert "train.on_collapse=warn: going on" in r.stderr
    recs = records(tmp_path)
    assert [x["event"] for x in recs].count("collapsed") == 1 and recs[-1]["event"] == "summary"


NOT_MOVING = ["--no-progress", "--set", "optim.lr=1e-9", "--set", "optim.scale_lr=false", "--set", "optim.warmup=none",
              "--set", "train.collapse_steps=10"]


def test_a_run_that_never_learned_is_not_done(tmp_path, capsys):
    """lr 1e-9: the net stays at chance. After the final checkpoint and evaluation (nothing is lost),
    status 6 and one line, not "done"; with train.on_collapse=warn, the line and status 0."""
    r, _ = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path / "stop"), "--epochs", "2", *NOT_MOVING], timeout=240)
    assert r.returncode == 6, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in hpctrain_lines(r.stderr, "") if "never left chance" in ln]
    assert len(lines) == 1 and lines[0].startswith("hpctrain: error: training never left chance: after 44 steps"), \
        r.stderr[-2000:]
    assert "ln C = 2.303" in lines[0] and "lr 1e-09 as given" in lines[0]
    recs = records(tmp_path / "stop")
    assert [x["event"] for x in recs][-2:] == ["summary", "never_learned"]
    assert recs[-2]["test_accuracy"] < 0.2 and recs[-2]["train_loss"] > 0.9 * 2.303
    assert (tmp_path / "stop" / "checkpoints" / "ckpt-000000044.pt").exists()
    st = subprocess.run([sys.executable, "-m", "hpctrain", "status", str(tmp_path / "stop")], capture_output=True,
                        text=True, timeout=60, env={**ENV, **__import__("os").environ})
    assert st.returncode == 6 and st.stdout.startswith("hpctrain: collapsed: training never left chance"), st.stdout
    r = run_cli(capsys, "--run-dir", str(tmp_path / "warn"), "--epochs", "2", *NOT_MOVING,
                "--set", "train.on_collapse=warn")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("hpctrain: warning: training never left chance") == 1, r.stderr[-2000:]
