"""Configuration: defaults < TOML < --set < flags; bad values stop with one line naming the field."""
import os
import subprocess
import sys

import pytest

from hpctrain.cli import config_from_args
from hpctrain.config import ConfigError, validate


def test_precedence(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[train]\nepochs = 3\nbatch_size = 32\n[optim]\nlr = 0.5\n")
    cfg = config_from_args(["--config", str(f), "--set", "train.epochs=5", "--batch-size", "16"])
    assert (cfg.train.epochs, cfg.train.batch_size, cfg.optim.lr) == (5, 16, 0.5)


@pytest.mark.parametrize("argv,field", [
    (["--set", "train.nope=1"], "train.nope"),
    (["--set", "bogus.x=1"], "bogus.x"),
    (["--set", "train.epochs=abc"], "train.epochs"),
    (["--set", "comm.overlap=maybe"], "comm.overlap"),
])
def test_bad_keys_and_types(argv, field):
    with pytest.raises(ConfigError, match=field):
        config_from_args(argv)


@pytest.mark.parametrize("argv,world,field", [
    (["--batch-size", "-4"], 1, "train.batch_size"),
    (["--batch-size", "30"], 4, "train.batch_size"),
    (["--lr", "0"], 1, "optim.lr"),
])
def test_validation(argv, world, field):
    with pytest.raises(ConfigError, match=field):
        validate(config_from_args(argv), world)


def run_cli(*args, **kw):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True,
                          env=env, timeout=120, **kw)


def test_cli_one_line_errors(tmp_path):
    r = run_cli("--batch-size", "-5")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["hpctrain: error: config train.batch_size: must be positive, got -5"]
    r = run_cli("--data", str(tmp_path / "missing"), "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing" in lines[0] and "not found" in lines[0], r.stderr


def test_help_lists_every_key():
    r = run_cli("--help")
    assert r.returncode == 0
    for key in ("train.batch_size", "comm.strategy", "optim.warmup_epochs", "data.block_size"):
        assert key in r.stdout
