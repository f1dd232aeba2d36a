"""examples/ddp/train.py: a plain DDP script whose only hpctrain lines are the marked ones runs
under mpiexec (no MASTER_ADDR/MASTER_PORT) and learns; fp16 on emulated one-rank nodes, where
it travels."""
import os

import pytest

from tests.integration.mpirun import mpirun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "ddp", "train.py")


def test_only_the_marked_lines_are_hpctrain():
    code = open(SCRIPT).read().split('"""', 2)[2]
    lines = [ln for ln in code.splitlines() if "hpctrain" in ln]
    assert len(lines) == 3, lines
    assert all(ln.split("#", 1)[1].strip().startswith("hpctrain") for ln in lines), lines


@pytest.mark.parametrize("extra, env, how", [([], {}, "hierarchical (auto: 2 ranks on a node), compression=none"),
                                             (["--fp16"], {"HPCTRAIN_RANKS_PER_NODE": "1"},
                                              "flat (auto: one rank per node), compression=fp16")],
                         ids=["fp32", "fp16"])
def test_ddp_example_trains(monkeypatch, extra, env, how):
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    r, _ = mpirun(2, [SCRIPT, "--epochs", "2", *extra], timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"DDP buckets reduced by {how}" in r.stderr
    epochs = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("epoch")]
    assert len(epochs) == 2, r.stdout
    assert float(epochs[1][3]) < float(epochs[0][3]) and float(epochs[1][5]) > 0.5, r.stdout
