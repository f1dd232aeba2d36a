"""``hpctrain/optim/sgd.py``, the worked example of "an optimiser is one file and one test"
(docs/development.md): each thing the file declares, checked against a computation of its own.
Chosen by name in the config, its steps are momentum SGD written out by hand (the 1-D parameters
without weight decay); it takes no options of its own; its recipe row is Goyal et al.'s; an unset
lr or warm-up takes the generic values (0.1 at batch 256, linearly scaled; 5 epochs)."""
import pytest
import torch

from hpctrain.job.args import config_from_args
from hpctrain.job.config import OptimConfig, validate
from hpctrain.errors import ConfigError
from hpctrain.models.small import SignalCNN, SmallCNN
from hpctrain.job.setup import build_optimizer, build_schedule
from hpctrain.optim import make_optimizer, spec_from_config
from hpctrain.optim.recipe import apply_recipe


def from_set(*items):
    cfg = config_from_args([a for item in items for a in ("--set", item)] + ["--run-dir", "/nonexistent/run"])
    validate(cfg)
    return cfg


def test_chosen_from_the_config_its_steps_are_momentum_sgd_by_hand():
    o = from_set("optim.name=sgd", "optim.lr=0.2", "optim.momentum=0.8", "optim.weight_decay=0.01").optim
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).double()
    opt = build_optimizer(model, o)
    w, b = (p.detach().clone() for p in model.parameters())
    vw = vb = None
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4, dtype=torch.float64)).pow(2).sum().backward()
        dw = model.weight.grad + 0.01 * w          # weight decay on the weight only ...
        db = model.bias.grad.clone()               # ... not on the 1-D bias (exclude_1d)
        vw, vb = (dw, db) if vw is None else (0.8 * vw + dw, 0.8 * vb + db)
        w, b = w - 0.2 * vw, b - 0.2 * vb
        opt.step()
        torch.testing.assert_close(model.weight.detach(), w, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(model.bias.detach(), b, rtol=1e-12, atol=1e-14)


def test_it_takes_no_options_of_its_own():
    with pytest.raises(ConfigError, match=r"^config optim\.sgd\.eta: unknown key"):
        from_set("optim.name=sgd", "optim.sgd.eta=0.01")
    with pytest.raises(TypeError, match=r"^make_optimizer: optimiser 'sgd' takes no keyword 'eta' \(its own: none\)$"):
        make_optimizer(torch.nn.Linear(2, 2), "sgd", lr=0.1, eta=0.01)


@pytest.mark.parametrize("batch", [256, 1024, 8192, 16384])
def test_recipe_row_is_goyals_with_or_without_normalisation(batch):
    peak = 0.1 * batch / 256
    want = (f"recipe auto (sgd, global batch {batch}): Goyal et al.: lr 0.1 x {batch}/256 = {peak:g}, 5 warm-up "
            f"epochs, cosine" + ("; above 8K use lars or lamb" if batch > 8192 else ""))
    for model in (SmallCNN(), SignalCNN()):
        o, line = apply_recipe(OptimConfig(name="sgd", recipe="auto"), batch, model)
        assert line == want
        spec = build_schedule(o, global_batch=batch, steps_per_epoch=10, epochs=90)
        assert (spec.peak_lr, spec.warmup_steps, spec.kind, o.lr_1d_scale) == (pytest.approx(peak), 50, "cosine", 1.0)


def test_unset_lr_and_warmup_are_the_generic_ones():
    spec = spec_from_config(lr=None, warmup_epochs=None, optimizer="sgd", global_batch=1024, steps_per_epoch=10,
                            epochs=90)
    assert (spec.peak_lr, spec.warmup_steps) == (pytest.approx(0.4), 50)
