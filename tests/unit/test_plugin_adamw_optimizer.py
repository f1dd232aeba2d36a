"""The worked example of an optimiser plugin (examples/plugins/adamw_optimizer.py,
docs/development.md): chosen by ``module:name`` in the config, its first step is AdamW's update
written out by hand: w (1 - lr wd) - lr g / (|g| + eps) (bias-corrected moments are g and g^2)."""
import pytest
import torch

from hpctrain.job.args import config_from_args
from hpctrain.job.config import validate
from hpctrain.job.setup import build_optimizer

pytestmark = pytest.mark.usefixtures("plugin_sandbox")   # registrations undone after each test
NAME = "examples.plugins.adamw_optimizer:adamw"


def test_selected_from_config_and_first_step_is_adamw():
    cfg = config_from_args(["--set", f"optim.name={NAME}", "--set", "optim.weight_decay=0.01",
                            "--set", "optim.adamw.eps=1e-8", "--run-dir", "/nonexistent/run"])
    validate(cfg)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).double()
    before = [p.detach().clone() for p in model.parameters()]
    opt = build_optimizer(model, cfg.optim)
    assert type(opt) is torch.optim.AdamW and opt.defaults["betas"] == (0.9, 0.999)
    model(torch.randn(3, 4, dtype=torch.float64)).pow(2).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    lr, wd, eps = cfg.optim.lr, 0.01, 1e-8
    for p, w, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), w * (1 - lr * wd) - lr * g / (g.abs() + eps), rtol=1e-9, atol=1e-12)
