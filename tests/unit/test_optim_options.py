"""The optimisers' own options in sub-tables (``[optim.lars]``, ``[optim.lamb]``; schema = the
factory's annotated keywords), from ``--set`` or a TOML file, build the same optimiser as LARS /
LAMB constructed directly with those values, and make_optimizer's
Python keywords (``eta``, ``eps``, ``clip``, ``beta2``) do, with the config's defaults."""
import pytest
import torch

from hpctrain.job.args import config_from_args
from hpctrain.job.config import validate
from hpctrain.job.setup import build_optimizer
from hpctrain.optim import LAMB, LARS, make_optimizer


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


def from_set(items, *args):
    cfg = config_from_args([*args, *[a for item in items for a in ("--set", item)], "--run-dir", "/nonexistent/run"])
    validate(cfg)
    return cfg


def from_toml(tmp_path, text):
    (tmp_path / "c.toml").write_text(text)
    return from_set([], "--config", str(tmp_path / "c.toml"))


def hyper(opt):
    """An optimiser's class, defaults and param groups without the tensors (what it will do)."""
    return type(opt), opt.defaults, [({k: v for k, v in g.items() if k != "params"}, len(g["params"]))
                                     for g in opt.param_groups]


def test_lars_keys_build_the_same_lars(tmp_path):
    configs = [from_set(["optim.name=lars", "optim.lars.eta=0.002", "optim.lars.eps=1e-8", "optim.lars.clip=true"]),
               from_toml(tmp_path, '[optim]\nname = "lars"\n[optim.lars]\neta = 0.002\neps = 1e-8\nclip = true\n')]
    assert all(c == configs[0] and c.to_dict() == configs[0].to_dict() for c in configs)
    assert configs[0].to_dict()["optim"]["lars"] == {"eta": 0.002, "eps": 1e-8, "clip": True}
    o = configs[0].optim
    direct = LARS(model().parameters(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, eta=0.002,
                  eps=1e-8, clip=True, exclude_1d=True, lr_1d_scale=1.0)
    for cfg in configs:
        assert hyper(build_optimizer(model(), cfg.optim)) == hyper(direct)


def test_lamb_keys_build_the_same_lamb(tmp_path):
    new = from_set(["optim.name=lamb", "optim.lamb.beta2=0.99", "optim.lamb.eps=1e-7"])
    assert new == from_toml(tmp_path, '[optim]\nname = "lamb"\n[optim.lamb]\nbeta2 = 0.99\neps = 1e-7\n')
    o = new.optim
    direct = LAMB(model().parameters(), lr=o.lr, betas=(o.momentum, 0.99), eps=1e-7, weight_decay=o.weight_decay)
    assert hyper(build_optimizer(model(), new.optim)) == hyper(direct)


@pytest.mark.parametrize("name,direct", [
    ("lars", lambda p, o: LARS(p, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, eta=0.001, eps=1e-9)),
    ("lamb", lambda p, o: LAMB(p, lr=o.lr, betas=(o.momentum, 0.999), eps=1e-6, weight_decay=o.weight_decay)),
])
def test_defaults_are_the_old_fields_defaults(name, direct):
    """Nothing given: eta 0.001, eps 1e-9, clip off; beta2 0.999, eps 1e-6 (OptimConfig's before)."""
    o = from_set([f"optim.name={name}"]).optim
    assert o.options == {}
    assert hyper(build_optimizer(model(), o)) == hyper(direct(model().parameters(), o))


def test_make_optimizer_keywords_still_work():
    lars = make_optimizer(model(), "lars", lr=0.5, weight_decay=1e-4, eta=0.01, eps=1e-8, clip=True)
    assert hyper(lars) == hyper(LARS(model().parameters(), lr=0.5, weight_decay=1e-4, eta=0.01, eps=1e-8, clip=True))
    lamb = make_optimizer(model(), "lamb", lr=0.01, momentum=0.8, beta2=0.95, eps=1e-8)
    assert hyper(lamb) == hyper(LAMB(model().parameters(), lr=0.01, betas=(0.8, 0.95), eps=1e-8))


@pytest.mark.parametrize("name,kw,own", [("sgd", {"eta": 0.01}, "none"),
                                         ("lamb", {"eps": 1e-8, "clip": True}, "beta2, eps"),
                                         ("lamb", {"adam_eps": 1e-8}, "beta2, eps"),
                                         ("lars", {"beta2": 0.9}, "eta, eps, clip")])
def test_make_optimizer_refuses_a_keyword_the_optimiser_does_not_take(name, kw, own):
    """Another optimiser's option or an old name (adam_eps) is one line naming it, not dropped
    (in the config the sub-tables scope them: optim.sgd.eta is an unknown key)."""
    bad = [k for k in kw if k != "eps"][0]
    with pytest.raises(TypeError, match=rf"^make_optimizer: optimiser '{name}' takes no keyword '{bad}' "
                                        rf"\(its own: {own}\)$"):
        make_optimizer(model(), name, lr=0.1, **kw)


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_make_optimizer_has_the_configs_defaults(name):
    """One default per option: make_optimizer and a config-built optimiser agree (LARS eps 1e-9,
    LAMB eps 1e-6; make_optimizer's LARS once defaulted to eps 0)."""
    o = from_set([f"optim.name={name}", "optim.lr=0.5", "optim.momentum=0.9", "optim.weight_decay=0"]).optim
    assert hyper(make_optimizer(model(), name, lr=0.5)) == hyper(build_optimizer(model(), o))
    assert make_optimizer(model(), name, lr=0.5).param_groups[0]["eps"] == {"lars": 1e-9, "lamb": 1e-6}[name]
