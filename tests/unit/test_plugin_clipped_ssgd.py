"""The worked example of an update-algorithm plugin (examples/plugins/clipped_ssgd.py,
docs/development.md): chosen by ``module:name`` in the config, a step equals plain SGD on the
gradient rescaled to norm ``max_norm`` by hand (float64), and a small gradient is left alone."""
import pytest
import torch
from mpi4py import MPI

from hpctrain import update as update_lib
from hpctrain.job.args import config_from_args
from hpctrain.config.plugins import plugin_options
from hpctrain.job.config import ConfigError, validate
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer

pytestmark = pytest.mark.usefixtures("plugin_sandbox")   # registrations undone after each test
NAME = "examples.plugins.clipped_ssgd:clipped_ssgd"


def half_mse(out, y):
    return 0.5 * ((out.squeeze(1) - y) ** 2).mean()


def expected_step(x, y, w, b, lr, max_norm):
    """One SGD step of a linear model on the hand-clipped gradient."""
    w, b = w.clone().requires_grad_(), b.clone().requires_grad_()
    half_mse((x @ w.T + b), y).backward()
    norm = torch.sqrt((w.grad ** 2).sum() + (b.grad ** 2).sum())
    factor = min(1.0, max_norm / float(norm))
    return w.detach() - lr * factor * w.grad, b.detach() - lr * factor * b.grad, float(norm)


@pytest.mark.parametrize("max_norm", [0.05, 1e6])
def test_selected_from_config_and_clips_the_mean(max_norm):
    cfg = config_from_args(["--set", f"update.algorithm={NAME}", "--run-dir", "/nonexistent/run"])
    validate(cfg)
    assert plugin_options(cfg.update, cfg.update.algorithm) == {"max_norm": 1.0}     # not given: its constructor's default
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1).double()
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, dtype=torch.float64) * 5
    want_w, want_b, norm = expected_step(x, y, model.weight.detach(), model.bias.detach(), 0.1, max_norm)
    topo = Topology.create(MPI.COMM_SELF)
    tr = DistributedTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), topo, algorithm=cfg.update.algorithm,
                            algorithm_options={"max_norm": max_norm}, loss_fn=half_mse)
    try:
        assert type(tr.algo).__name__ == "ClippedSSGD"
        tr.step(x, y)
        tr.finish()
        assert (norm > max_norm) == (max_norm == 0.05)          # one clips, the other does not
        # clip_grad_norm_ divides by norm + 1e-6: relative 1e-6 / norm of the step
        torch.testing.assert_close(model.weight.detach(), want_w, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(model.bias.detach(), want_b, rtol=1e-6, atol=1e-7)
    finally:
        tr.close()


def test_bad_max_norm_is_one_line():
    model = torch.nn.Linear(3, 1)
    with pytest.raises(ConfigError, match=r"^config update\.clipped_ssgd\.max_norm: must be positive, got 0$"):
        update_lib.create(NAME, model, torch.optim.SGD(model.parameters(), lr=0.1), None, max_norm=0)


def test_its_option_is_a_config_sub_table_with_no_edit_elsewhere(tmp_path):
    """``max_norm`` is read from ``[update.clipped_ssgd]`` / ``--set update.clipped_ssgd.max_norm``, by
    the type and range its constructor declares."""
    f = tmp_path / "c.toml"
    f.write_text(f'[update]\nalgorithm = "{NAME}"\n[update.clipped_ssgd]\nmax_norm = 0.05\n')
    from_file = config_from_args(["--config", str(f), "--run-dir", "/nonexistent/run"])
    from_set = config_from_args(["--set", f"update.algorithm={NAME}", "--set", "update.clipped_ssgd.max_norm=0.05",
                                 "--run-dir", "/nonexistent/run"])
    assert from_file == from_set
    validate(from_set)
    assert plugin_options(from_set.update, NAME) == {"max_norm": 0.05}
    bad = config_from_args(["--set", f"update.algorithm={NAME}", "--set", "update.clipped_ssgd.max_norm=0"])
    with pytest.raises(ConfigError, match=r"^config update\.clipped_ssgd\.max_norm: must be positive, got 0\.0$"):
        validate(bad)
    from hpctrain.job.config import help_text
    assert "  update.clipped_ssgd.max_norm = 1.0\n      clip the mean gradient to this global L2 norm (must be positive)" \
        in help_text()
