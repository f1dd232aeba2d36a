"""Configuration: defaults < TOML < --set < flags; bad values stop with one line naming the field;
every number finite and in its range; choice keys read from their registries."""
import dataclasses
import importlib
import inspect
import math
import re

import numpy as np
import pytest

from hpctrain.job.args import config_from_args
from hpctrain.config.registries import Registry
from hpctrain.job.config import Config, ConfigError, load_toml, sections, set_value, validate
from hpctrain.config import LOSS_SCALE, Range, registry
from hpctrain.config.plugins import option_schema
from tests.integration.inprocess import run_cli


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




def test_cli_one_line_errors(tmp_path, capsys):
    r = run_cli(capsys, "--batch-size", "-5")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["hpctrain: error: config train.batch_size: must be positive, got -5"]
    r = run_cli(capsys, "--data", str(tmp_path / "missing"), "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "missing" in lines[0] and "not found" in lines[0], r.stderr


def test_help_lists_every_key(capsys):
    r = run_cli(capsys, "--help")
    assert r.returncode == 0
    for key in ("train.batch_size", "comm.strategy", "optim.warmup_epochs", "data.block_size"):
        assert key in r.stdout


# --- numbers: every float finite and in range; choices read from the registries ---------------------
def typed_fields(tname):
    """``section.key`` of every field whose annotation is ``tname`` (``float``, ``int``…)."""
    return [(f"{name}.{f.name}", f) for name, sec in sections(Config())
            for f in dataclasses.fields(sec) if f.type == tname]


FLOATS = typed_fields("float")
RANGED = FLOATS + typed_fields("int") + typed_fields("list")


def test_every_float_field_has_a_finite_range():
    assert len(FLOATS) >= 15
    for key, f in FLOATS:
        rng = f.metadata["range"]
        assert isinstance(rng, Range) and math.isfinite(rng.lo) and math.isfinite(rng.hi), key
        assert getattr(getattr(Config(), key.split(".")[0]), f.name) in rng, f"{key}: default out of range"
    for key, f in typed_fields("int"):
        assert isinstance(f.metadata["range"], Range), key


@pytest.mark.parametrize("key", [k for k, _ in FLOATS])
@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e400", "Infinity"])
def test_non_finite_floats_are_refused_for_every_field(key, text):
    with pytest.raises(ConfigError, match=rf"^config {key}: expected a finite float"):
        set_value(Config(), key, text)


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_non_finite_toml_values_are_refused(tmp_path, value):
    f = tmp_path / "c.toml"
    f.write_text(f"[optim]\nlr = {value}\n")
    with pytest.raises(ConfigError, match="optim.lr: expected a finite float"):
        load_toml(Config(), str(f))
    f.write_text(f"[optim]\nstep_epochs = [3, {value}]\n")
    with pytest.raises(ConfigError, match="optim.step_epochs: expected a list of finite numbers"):
        load_toml(Config(), str(f))


def outside(rng: Range) -> list:
    """Values just outside ``rng`` (independent of Range.__contains__: by its ends)."""
    out = [rng.lo if rng.lo_open else rng.lo - 1]
    if math.isfinite(rng.hi):
        out.append(rng.hi if rng.hi_open else rng.hi * 2 + 1)
    return out


@pytest.mark.parametrize("key,f", RANGED, ids=[k for k, _ in RANGED])
def test_every_ranged_field_refuses_values_outside_its_range(key, f):
    rng = f.metadata["range"]
    section = key.split(".")[0]
    for bad in outside(rng):
        cfg = Config()
        value = [bad] if f.type == "list" else (int(bad) if f.type == "int" else float(bad))
        setattr(getattr(cfg, section), f.name, value)
        cfg.run.run_dir = "/nonexistent-dir-for-tests/run"
        with pytest.raises(ConfigError, match=rf"^config {key}: must be"):
            validate(cfg)
    mid = (rng.lo + rng.hi) / 2 if math.isfinite(rng.hi) else rng.lo + 2
    for good in ([mid] if rng.lo_open else [rng.lo, mid]):
        cfg = Config()
        good = int(good) if f.type == "int" else good
        setattr(getattr(cfg, section), f.name, [good] if f.type == "list" else good)
        cfg.run.run_dir = "/nonexistent-dir-for-tests/run"
        validate(cfg)


def plugin_numbers():
    """``(section.plugin.option, spec)`` of every numeric option of every registered plugin (the
    sub-tables: OD-SGD's, LARS's, LAMB's...), read from the registries the config names."""
    out = []
    for name, sec in sections(Config()):
        for f in dataclasses.fields(sec):
            if "plugins" in f.metadata:
                for plugin, factory in f.metadata["plugins"].items():
                    out += [(f"{name}.{plugin}.{k}", spec) for k, spec in option_schema(factory).items()
                            if spec.type in (int, float)]
    return out


PLUGIN_NUMBERS = plugin_numbers()


def test_plugin_options_are_found():
    keys = {k for k, _ in PLUGIN_NUMBERS}
    assert {"update.odsgd.warmup_steps", "update.odsgd.local_lr", "optim.lars.eta", "optim.lamb.beta2"} <= keys


@pytest.mark.parametrize("key,spec", PLUGIN_NUMBERS, ids=[k for k, _ in PLUGIN_NUMBERS])
def test_every_plugin_option_has_a_finite_range_and_refuses_what_is_outside(key, spec):
    """The same rules as the fields above, for the options declared on the plugins' constructors."""
    rng = spec.option.range
    assert isinstance(rng, Range) and spec.default in rng, key
    if spec.type is float:                                      # a float's range is finite (ints may be open)
        assert math.isfinite(rng.lo) and math.isfinite(rng.hi), key
        for text in ("inf", "nan", "1e400"):
            with pytest.raises(ConfigError, match=rf"^config {re.escape(key)}: expected a finite float"):
                set_value(Config(), key, text)
    section, plugin, _ = key.split(".")
    for bad in outside(rng):
        cfg = Config()
        setattr(cfg.update if section == "update" else cfg.optim, "algorithm" if section == "update" else "name", plugin)
        set_value(cfg, key, str(int(bad) if spec.type is int else float(bad)))
        cfg.run.run_dir = "/nonexistent-dir-for-tests/run"
        with pytest.raises(ConfigError, match=rf"^config {re.escape(key)}: must be"):
            validate(cfg)


def test_loss_scale_range_is_the_loss_scalers():
    from hpctrain.optim.loss_scale import MAX_SCALE, MIN_SCALE, LossScaler
    assert (LOSS_SCALE.lo, LOSS_SCALE.hi) == (MIN_SCALE, MAX_SCALE) == (1.0, 2.0 ** 24)
    defaults = inspect.signature(LossScaler).parameters
    assert (defaults["min_scale"].default, defaults["max_scale"].default) == (MIN_SCALE, MAX_SCALE)
    # the top of the range keeps fp32 math finite: loss 10 and gradients 1e20 scaled by 2**24
    with np.errstate(over="ignore"):
        assert np.isfinite(np.float32(10.0 * MAX_SCALE)) and np.isfinite(np.float32(1e20 * MAX_SCALE))
        assert not np.isfinite(np.float32(1e9 * 1e30))     # what init_scale=1e30 would do


@pytest.mark.parametrize("argv,field", [
    (["--set", "precision.init_scale=1e30"], "precision.init_scale"),
    (["--set", "precision.init_scale=0.5"], "precision.init_scale"),
    (["--set", "precision.loss_scale=inf"], "precision.loss_scale"),
    (["--set", "precision.loss_scale=nan"], "precision.loss_scale"),
    (["--set", "precision.loss_scale=1e30"], "precision.loss_scale"),
    (["--set", "precision.loss_scale=0"], "precision.loss_scale"),
    (["--set", "precision.loss_scale=huge"], "precision.loss_scale"),
    (["--set", "precision.growth_interval=0"], "precision.growth_interval"),
    (["--lr", "1e9"], "optim.lr"),
    (["--set", "optim.momentum=1"], "optim.momentum"),
    (["--set", "train.seed=-1"], "train.seed"),
])
def test_out_of_range_numbers(argv, field):
    with pytest.raises(ConfigError, match=field):
        validate(config_from_args(argv + ["--run-dir", "/nonexistent-dir-for-tests/run"]))


def test_fixed_loss_scale_in_range_is_accepted():
    for scale in ("1", "128", "16777216", "dynamic", "none"):
        cfg = config_from_args(["--set", f"precision.loss_scale={scale}", "--run-dir", "/nonexistent/run"])
        validate(cfg)                                         # raises ConfigError where it is refused
        assert cfg.precision.loss_scale == scale              # kept as given, the bounds included


CHOICES = [("comm.strategy", "hpctrain.comm", "STRATEGIES"),
           ("comm.compression", "hpctrain.comm", "COMPRESSIONS"),
           ("update.algorithm", "hpctrain.update", "ALGORITHMS"),
           ("precision.compute", "hpctrain.trainer", "AUTOCAST_DTYPES"),
           ("optim.schedule", "hpctrain.optim.schedules", "KINDS"),
           ("optim.warmup", "hpctrain.optim.schedules", "WARMUPS"),
           ("optim.name", "hpctrain.optim", "OPTIMIZERS"),
           ("optim.recipe", "hpctrain.optim.recipe", "RECIPES")]


@pytest.mark.parametrize("key,module,name", CHOICES)
def test_choice_fields_follow_their_registry(key, module, name, monkeypatch):
    reg = getattr(importlib.import_module(module), name)
    section, _, attr = key.partition(".")
    for value in reg:                            # every registered name is accepted
        cfg = Config()
        setattr(getattr(cfg, section), attr, value)
        cfg.run.run_dir = "/nonexistent/run"
        validate(cfg)
    cfg = Config()
    setattr(getattr(cfg, section), attr, "ring")
    with pytest.raises(ConfigError, match=rf"^config {key}: must be one of .*got 'ring'"):
        validate(cfg)
    # a name registered later is accepted without touching the schema (a registry, not a fixed tuple)
    if isinstance(reg, Registry):
        monkeypatch.setitem(reg._entries, "ring", None)
        cfg.run.run_dir = "/nonexistent/run"
        validate(cfg)


def test_strategy_ring_names_the_registry_choices():
    from hpctrain.comm import STRATEGIES
    with pytest.raises(ConfigError) as err:
        validate(config_from_args(["--strategy", "ring"]))
    assert str(err.value) == f"config comm.strategy: must be one of {' | '.join(STRATEGIES)}, got 'ring'"
    assert registry(STRATEGIES) == tuple(STRATEGIES)


def test_config_file_not_utf8_or_not_a_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_bytes(b"[optim]\nlr = 0.1 # caf\xe9 in latin-1\n")
    with pytest.raises(ConfigError, match=r"config file .*bad.toml: not UTF-8 text \(byte 0xe9"):
        load_toml(Config(), str(f))
    with pytest.raises(ConfigError, match="config file .*: Is a directory"):
        load_toml(Config(), str(tmp_path))


def test_run_dir_must_be_a_directory(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv, field in ((["--run-dir", str(afile)], "run.run_dir"),
                        (["--run-dir", str(afile / "sub" / "run")], "run.run_dir"),
                        (["--run-dir", str(tmp_path / "ok"), "--set", f"ckpt.dir={afile}"], "ckpt.dir")):
        with pytest.raises(ConfigError, match=rf"^config {field}: .*{afile}.*(exists and )?is not a directory"):
            validate(config_from_args(argv))
    validate(config_from_args(["--run-dir", str(tmp_path / "new" / "run")]))    # created later
    validate(config_from_args(["--run-dir", str(tmp_path)]))                     # exists


def test_help_shows_ranges():
    from hpctrain.job.config import help_text
    text = help_text()
    assert "optim.lr = 0.4\n" in text and "(must be in (0, 1000])" in text
    assert "precision.init_scale = 65536.0\n      initial dynamic loss scale (must be in [1, 16777216])" in text


@pytest.mark.parametrize("args,line", [
    (["--lr", "inf"], "hpctrain: error: config optim.lr: expected a finite float, got 'inf'"),
    (["--set", "precision.init_scale=1e30"],
     "hpctrain: error: config precision.init_scale: must be in [1, 16777216], got 1e+30"),
    (["--set", "optim.recipe=magic"], "hpctrain: error: config optim.recipe: must be one of none | auto, got 'magic'"),
    (["--set", "optim.lr_1d_scale=2"], "hpctrain: error: config optim.lr_1d_scale: must be in [0, 1], got 2.0"),
    (["--optimizer", "adam"], "hpctrain: error: config optim.name: must be one of sgd | lars | lamb, got 'adam'"),
])
def test_cli_numbers_one_line_status_2(tmp_path, capsys, args, line):
    r = run_cli(capsys, *args, "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "run").exists()


def test_train_device_binding_without_cuda(monkeypatch):
    """train.device: cpu always; auto is cpu without CUDA; cuda without CUDA is a ConfigError."""
    from types import SimpleNamespace

    import torch

    from hpctrain.api import bind_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    topo = SimpleNamespace(local_rank=3)
    assert bind_device(topo, "cpu") == torch.device("cpu")
    assert bind_device(topo, "auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="train.device: cuda, but torch sees no CUDA device"):
        bind_device(topo, "cuda")
    with pytest.raises(ConfigError, match=re.escape("must be one of auto | cpu | cuda, got 'gpu'")):
        bind_device(topo, "gpu")
    cfg = Config()
    set_value(cfg, "train.device", "gpu")
    with pytest.raises(ConfigError, match=re.escape("config train.device: must be one of auto | cpu | cuda, got 'gpu'")):
        validate(cfg)
