"""End to end: numbers that would poison a run stop it with one line and status 2.

Bad configuration (the CLI's entry in process: its stderr is exactly our line): a non-UTF-8 TOML file, inf in
TOML, an unregistered strategy, a run directory that is a file, a loss scale fp32 cannot carry.
Bad training (``mpiexec -n 2``): fp16 compression without loss scaling at a huge lr (F8, which
used to end with every weight NaN and status 0) and OD-SGD at a huge lr stop on every rank with
one ``hpctrain: error: step N: ...`` line, no traceback, no abort, and no summary written.
"""
import json
import re

import pytest

from tests.integration.mpirun import hpctrain_lines, mpirun
from tests.integration.inprocess import run_cli


@pytest.mark.parametrize("case,line", [
    ("latin1_toml", r"config file .*bad\.toml: not UTF-8 text \(byte 0xe9 at offset \d+\)"),
    ("inf_toml", r"config optim\.lr: expected a finite float, got inf"),
    ("ring", r"config comm\.strategy: must be one of flat \| hierarchical \| auto, got 'ring'"),
    ("run_dir_file", r"config run\.run_dir: .*afile exists and is not a directory"),
    ("init_scale", r"config precision\.init_scale: must be in \[1, 16777216\], got 1e\+30"),
])
def test_bad_config_one_line_status_2(tmp_path, capsys, case, line):
    run_dir = tmp_path / "run"
    args = {
        "latin1_toml": ["--config", str(tmp_path / "bad.toml")],
        "inf_toml": ["--config", str(tmp_path / "inf.toml")],
        "ring": ["--strategy", "ring"],
        "run_dir_file": [],
        "init_scale": ["--set", "precision.init_scale=1e30", "--set", "precision.loss_scale=dynamic"],
    }[case]
    (tmp_path / "bad.toml").write_bytes(b"[optim]\nlr = 0.1  # caf\xe9\n")
    (tmp_path / "inf.toml").write_text("[optim]\nlr = inf\n")
    if case == "run_dir_file":
        run_dir = tmp_path / "afile"
        run_dir.write_text("not a directory")
    r = run_cli(capsys, *args, "--run-dir", str(run_dir), "--epochs", "1", "--no-progress")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"hpctrain: error: " + line, lines[0]), r.stderr


STOP_LINE = re.compile(r"hpctrain: error: step \d+: (non-finite (loss|gradient)|the sum of finite gradients "
                       r"overflowed|the weights became non-finite)")


@pytest.mark.parametrize("extra", [
    ["--compression", "fp16"],                                                   # F8
    ["--set", "update.algorithm=odsgd", "--set", "update.odsgd.warmup_steps=2"],
], ids=["fp16_wire", "odsgd"])
def test_diverging_run_stops_every_rank_with_one_line(tmp_path, extra):
    r, secs = mpirun(2, ["-m", "hpctrain", "--run-dir", str(tmp_path), "--no-progress", "--epochs", "3",
                         "--lr", "1000", *extra], timeout=240)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    ours = hpctrain_lines(r.stderr)
    assert len(ours) == 1 and STOP_LINE.match(ours[0]), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "aborting" not in r.stderr
    events = [json.loads(x)["event"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "summary" not in events
