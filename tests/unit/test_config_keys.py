"""Plugin options in sub-tables (``[update.odsgd]``, schema = the plugin's constructor): a TOML
file and ``--set`` give the same config, a key renamed before (docs/changelog.md) is an unknown
key, a bad sub-table key or value is one line naming it, ``--help`` lists what the registries
hold, and reading a config imports no torch."""
import inspect
import re
import subprocess
import sys
from typing import Annotated  # noqa: F401  (read by a string annotation below)

import pytest

from hpctrain.job.args import config_from_args
from hpctrain.config.plugins import plugin_options
from hpctrain.job.config import Config, ConfigError, help_text, load_toml, validate
from hpctrain.config.values import NON_NEGATIVE, Option

NEW_TOML = """
[update]
algorithm = "odsgd"
[update.odsgd]
warmup_steps = 7
local_lr = 0.05
local_momentum = 0.5
dc_lambda = 0.1
[comm]
delay_ms = 3
[optim]
exclude_1d = false
[optim.lars]
eta = 0.002
eps = 1e-8
clip = true
[optim.lamb]
beta2 = 0.99
eps = 1e-7
"""
# the keys before the sub-tables (docs/changelog.md): unknown now, each with the value above
OLD_SET = ["sync.odsgd.warmup_steps=7", "sync.odsgd_warmup_steps=7", "sync.odsgd_local_lr=0.05",
           "sync.odsgd_local_momentum=0.5", "sync.odsgd_dc_lambda=0.1", "sync.comm_delay_ms=3", "optim.lars_exclude_1d=false", "optim.lars_eta=0.002",
           "optim.lars_eps=1e-8", "optim.lars_clip=true", "optim.lamb_beta2=0.99", "optim.lamb_eps=1e-7"]
NEW_SET = ["update.algorithm=odsgd", "update.odsgd.warmup_steps=7", "update.odsgd.local_lr=0.05",
           "update.odsgd.local_momentum=0.5", "update.odsgd.dc_lambda=0.1", "comm.delay_ms=3", "optim.exclude_1d=false",
           "optim.lars.eta=0.002", "optim.lars.eps=1e-8", "optim.lars.clip=true", "optim.lamb.beta2=0.99",
           "optim.lamb.eps=1e-7"]


def from_toml(tmp_path, text):
    f = tmp_path / "c.toml"
    f.write_text(text)
    cfg = Config()
    load_toml(cfg, str(f))
    return cfg


def from_set(items):
    return config_from_args([a for item in items for a in ("--set", item)])


def test_toml_and_set_give_identical_configs(tmp_path):
    from hpctrain import update as update_lib
    configs = [from_toml(tmp_path, NEW_TOML), from_set(NEW_SET)]
    for cfg in configs:
        assert cfg == configs[0] and cfg.to_dict() == configs[0].to_dict()
    cfg = configs[0]
    assert (cfg.comm.delay_ms, cfg.optim.exclude_1d) == (3.0, False)
    assert plugin_options(cfg.update, cfg.update.algorithm) == {"warmup_steps": 7, "local_lr": 0.05, "local_momentum": 0.5,
                                                    "dc_lambda": 0.1}
    # the dump (metrics.jsonl, checkpoints) spells the sub-table as a TOML file does
    assert cfg.to_dict()["update"] == {"algorithm": "odsgd", "odsgd": {"warmup_steps": 7, "local_lr": 0.05,
                                                                     "local_momentum": 0.5, "dc_lambda": 0.1}}


def test_algorithm_options_default_to_the_constructors():
    from hpctrain import update as update_lib
    from hpctrain.update import ODSGD
    defaults = {k: p.default for k, p in inspect.signature(ODSGD).parameters.items()
                if k in ("warmup_steps", "local_lr", "local_momentum", "dc_lambda")}
    assert plugin_options(from_set(["update.algorithm=odsgd"]).update, "odsgd") == defaults
    assert plugin_options(from_set(["update.odsgd.warmup_steps=3"]).update, "ssgd") == {}    # ssgd: none


@pytest.mark.parametrize("item", OLD_SET)
def test_a_key_renamed_before_is_an_unknown_key(item, tmp_path):
    """No alias: the old spelling is refused in one line naming it, in a file as on the command line."""
    key, _, value = item.partition("=")
    with pytest.raises(ConfigError, match=rf"^config {re.escape(key)}: unknown key"):
        from_set([item])
    section, _, name = key.partition(".")
    with pytest.raises(ConfigError, match=rf"^config {re.escape(key)}: unknown key"):
        from_toml(tmp_path, f"[{section}]\n{name} = {value if value[0].isdigit() else value.lower()}\n")


@pytest.mark.parametrize("items,message", [
    (["update.odsgd.nope=1"], "config update.odsgd.nope: unknown key (odsgd's options: warmup_steps, local_lr, "
                            "local_momentum, dc_lambda)"),
    (["update.ring.x=1"], "config update.ring.x: unknown key (sub-tables of [update]: odsgd)"),
    (["update.odsgd.warmup_steps=1.5"], "config update.odsgd.warmup_steps: expected int, got '1.5'"),
    (["update.odsgd.local_lr=nan"], "config update.odsgd.local_lr: expected a finite float, got 'nan'"),
    (["update.odsgd.local_momentum=1"], "config update.odsgd.local_momentum: must be in [0, 1), got 1.0"),
    (["comm.delay_ms=-1"], "config comm.delay_ms: must be in [0, 60000], got -1.0"),
    (["update.options=1"], "config update.options: unknown key"),
    (["optim.lars.eta=0"], "config optim.lars.eta: must be in (0, 1], got 0.0"),
    (["optim.lamb.beta2=1.5"], "config optim.lamb.beta2: must be in [0, 1), got 1.5"),
    (["optim.lars.clip=maybe"], "config optim.lars.clip: expected bool, got 'maybe'"),
    (["optim.adam.eps=1e-8"], "config optim.adam.eps: unknown key (sub-tables of [optim]: lars, lamb)"),
    (["optim.sgd.eta=0.1"], "config optim.sgd.eta: unknown key (sgd's options: none)"),
    (["comm.fp16.x=1"], "config comm.fp16.x: unknown key (fp16's options: none)"),
    (["update.mod:odsgd.x=1"], "config update.mod:odsgd.x: unknown key (name the sub-table by the plugin's registered "
                             "name, odsgd)"),
])
def test_bad_sub_table_key_or_value_names_it(items, message):
    with pytest.raises(ConfigError) as err:
        validate(from_set(items + ["run.run_dir=/nonexistent/run"]))
    assert str(err.value) == message


def test_toml_sub_table_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^config update\.odsgd\.warmup_steps: expected int, got 'many'$"):
        from_toml(tmp_path, '[update.odsgd]\nwarmup_steps = "many"\n')


def test_help_lists_plugin_options_and_registry_choices(plugin_sandbox):
    text = help_text()
    assert "  update.odsgd.warmup_steps = 200\n      plain SSGD for the first N steps (must be >= 0)" in text
    assert "  update.odsgd.local_momentum = 0.0\n" in text and "update.odsgd_warmup_steps" not in text
    assert "  optim.lars.eta = 0.001\n      LARS trust coefficient eta (must be in (0, 1])" in text
    assert "  optim.lamb.beta2 = 0.999\n" in text and "optim.lars_eta" not in text and "renamed" not in text
    assert "      optimiser: sgd | lars | lamb\n" in text and "{choices}" not in text
    import examples.plugins.adamw_optimizer  # noqa: F401  registers adamw
    assert "      optimiser: sgd | lars | lamb | adamw\n" in help_text()


# --- a data or optimiser option is written in its section and its function's signature, no adapter line ---
def test_every_data_field_but_the_datasets_is_a_loader_keyword():
    import dataclasses

    from hpctrain.job.config import DataConfig
    from hpctrain.data.factory import train_loader
    fields = {f.name for f in dataclasses.fields(DataConfig)}
    assert fields - set(inspect.signature(train_loader).parameters) == {"dataset", "cache_dir"}   # job._data_index


def test_loader_keywords_pass_each_field_by_its_name():
    from hpctrain.job.config import DataConfig
    from hpctrain.job.setup import loader_keywords
    cfg = Config()
    cfg.data = DataConfig(block_size=7, shuffle_window=5, prefetch=0, augment=True, drop_last=False,
                          augment_kind="flip", augment_flip=False, reader="node", hdf5_driver="serial", verify="off",
                          workers=3, decode="cpu", lanes=6)
    cfg.train.batch_size, cfg.train.seed = 6, 2
    seen = loader_keywords(cfg, ranks=2)
    assert seen == dict(block_size=7, shuffle_window=5, prefetch=0, augment=True, drop_last=False, augment_kind="flip",
                        augment_flip=False, reader="node", hdf5_driver="serial", verify="off", batch_size=3, seed=2,
                        raw=False, workers=3, decode="cpu", lanes=6)


def test_optimiser_adapter_passes_each_field(monkeypatch):
    import functools

    import hpctrain.job.setup as setup_lib
    import hpctrain.optim as optim_lib
    seen = {}

    @functools.wraps(optim_lib.make_optimizer)
    def record(params_or_model, name, lr, **kw):
        seen.update(kw, name=name, lr=lr)
    monkeypatch.setattr(setup_lib, "make_optimizer", record)
    o = from_set(["optim.name=lamb", "optim.lr=0.3", "optim.momentum=0.8", "optim.weight_decay=0.01",
                  "optim.nesterov=true", "optim.exclude_1d=false", "optim.lars.eta=0.002", "optim.lars.eps=1e-8",
                  "optim.lars.clip=true", "optim.lr_1d_scale=0.5", "optim.lamb.beta2=0.99",
                  "optim.lamb.eps=1e-7"]).optim
    setup_lib.build_optimizer([], o)
    assert seen == dict(name="lamb", lr=0.3, momentum=0.8, weight_decay=0.01, nesterov=True, exclude_1d=False,
                        lr_1d_scale=0.5, beta2=0.99, eps=1e-7)           # the chosen optimiser's own options
    o.name = "lars"
    setup_lib.build_optimizer([], o)
    assert {k: seen[k] for k in ("name", "eta", "eps", "clip")} == dict(name="lars", eta=0.002, eps=1e-8, clip=True)


def test_recompute_bn_stats_is_exported_under_one_name():
    import hpctrain
    from hpctrain.models.polish import recompute_bn_stats
    assert hpctrain.recompute_bn_stats is recompute_bn_stats and "recompute_bn_stats" in hpctrain.__all__
    assert "polish_bn" not in hpctrain.__all__ and not hasattr(hpctrain, "polish_bn")   # the old alias: gone


RAMP_SOURCE = '''
import numpy as np
from hpctrain.data_tools.sources import from_arrays, source


@source("ramp")
def ramp(src, **_):
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.arange(20) % 2
    return from_arrays({"train": (x[:16], y[:16]), "test": (x[16:], y[16:])}, ["even", "odd"], "ramp")
'''


def test_dataset_may_name_a_data_source_plugin(tmp_path, monkeypatch, plugin_sandbox):
    """``data.dataset = "module:name"``: the plugin (registered like ``data_tools convert --from``
    takes it) is converted on first use into the cache, as a built-in dataset is."""
    from mpi4py import MPI

    from hpctrain.data import ShardSet, read_index
    from hpctrain.data_tools.builtin import resolve_dataset
    (tmp_path / "ramp_source_for_test.py").write_text(RAMP_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ramp_source_for_test", raising=False)
    cfg = from_set(["data.dataset=ramp_source_for_test:ramp", f"data.cache_dir={tmp_path / 'cache'}",
                    f"run.run_dir={tmp_path / 'run'}"])
    validate(cfg)
    path = resolve_dataset(cfg.data.dataset, cfg.data.cache_dir, MPI.COMM_SELF)
    assert path == str(tmp_path / "cache" / "plugin-ramp_source_for_test.ramp")
    got = {}
    for split in ("train", "test"):
        s = ShardSet(read_index(path), split)
        got[split] = s.read_range(0, s.num_samples)
        s.close()
    x = sorted(map(tuple, got["train"][0])) + sorted(map(tuple, got["test"][0]))
    assert x == [(2.0 * i, 2.0 * i + 1) for i in range(20)]
    assert sorted(got["test"][1].tolist()) == [0, 0, 1, 1]
    sys.modules.pop("ramp_source_for_test", None)


def test_dataset_plugin_that_does_not_import_is_one_line(tmp_path):
    """Checked with every other value (:func:`validate`, importing the data tools only then) and
    again where the dataset is resolved (a library caller's), before anything is converted; a
    directory is not a plugin."""
    from mpi4py import MPI

    from hpctrain.data_tools.builtin import resolve_dataset
    cfg = from_set(["data.dataset=no_such_module_x:ramp", f"data.cache_dir={tmp_path / 'cache'}",
                    f"run.run_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=r"^config data\.dataset: plugin 'no_such_module_x:ramp': cannot import"):
        validate(cfg)
    with pytest.raises(ConfigError, match=r"^config data\.dataset: plugin 'no_such_module_x:ramp': cannot import"):
        resolve_dataset(cfg.data.dataset, cfg.data.cache_dir, MPI.COMM_SELF)
    assert not (tmp_path / "cache").exists()
    assert resolve_dataset(str(tmp_path), cfg.data.cache_dir, MPI.COMM_SELF) == str(tmp_path)


def test_the_cli_refuses_a_dataset_plugin_before_the_job_starts(tmp_path):
    """The same line and status as any config error, and no run directory made."""
    code = ("import sys; from hpctrain.job import entry\n"
            "sys.exit(entry.train_main(['--data', 'no_such_module_x:ramp', '--run-dir', sys.argv[1]]))\n")
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(
        "hpctrain: error: config data.dataset: plugin 'no_such_module_x:ramp': cannot import"), r.stderr[-2000:]
    assert not run_dir.exists()


def test_schema_reads_the_options_where_another_annotation_does_not_resolve():
    from hpctrain.config.plugins import option_schema

    def factory(model: "OnlyForTypeCheckers", *, steps: "Annotated[int, Option('n', NON_NEGATIVE)]" = 3,  # noqa: F821
                plain: int = 0):
        return model
    (spec,) = option_schema(factory).values()
    assert (spec.name, spec.type, spec.default, spec.option) == ("steps", int, 3, Option("n", NON_NEGATIVE))


def test_cli_help_lists_the_sub_table_keys():
    import os
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run([sys.executable, "-m", "hpctrain", "--help"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    for key in ("update.odsgd.warmup_steps = 200", "update.odsgd.dc_lambda = 0.0", "comm.delay_ms = 0.0",
                "optim.exclude_1d = True",
                "optim.lars.eta = 0.001\n      LARS trust coefficient eta (must be in (0, 1])"):
        assert key in r.stdout, key


def test_old_names_are_no_attributes_or_keywords():
    """Python code written before the sub-tables gets the plain errors of a name that does not exist."""
    from hpctrain.job.config import OptimConfig, UpdateConfig
    with pytest.raises(AttributeError):
        Config().optim.lars_eta                                    # noqa: B018
    with pytest.raises(AttributeError):
        Config().update.comm_delay_ms                                # noqa: B018
    with pytest.raises(TypeError, match="lars_eta"):
        OptimConfig(lars_eta=0.002)
    with pytest.raises(TypeError, match="odsgd_warmup_steps"):
        UpdateConfig(algorithm="odsgd", odsgd_warmup_steps=3)


def test_record_holds_every_option_the_chosen_plugins_run_with():
    """The run record (``to_dict``) says what ran: the chosen algorithm's and optimiser's options
    with their defaults (read from the constructors here, independently), the others as given."""
    import inspect

    from hpctrain.optim import OPTIMIZERS
    from hpctrain.update import ODSGD
    cfg = from_set(["update.algorithm=odsgd", "update.odsgd.warmup_steps=3", "optim.name=lars", "optim.lamb.beta2=0.9"])
    rec = cfg.to_dict()
    defaults = {k: p.default for k, p in inspect.signature(ODSGD).parameters.items()
                if k in ("warmup_steps", "local_lr", "local_momentum", "dc_lambda")}
    assert rec["update"]["odsgd"] == {**defaults, "warmup_steps": 3}
    lars = inspect.signature(OPTIMIZERS.get("lars")).parameters
    assert rec["optim"]["lars"] == {k: lars[k].default for k in ("eta", "eps", "clip")}
    assert rec["optim"]["lamb"] == {"beta2": 0.9}                         # not chosen: as given
    assert "odsgd" not in Config().to_dict()["update"] and "lars" not in Config().to_dict()["optim"]


def test_optimiser_options_given_in_code_meet_the_configs_rule():
    """``make_optimizer`` checks LARS's and LAMB's own options by the range the config applies:
    one rule, one message."""
    import torch

    from hpctrain.optim import make_optimizer
    m = torch.nn.Linear(2, 2)
    for name, kw, key in (("lars", {"eta": 5.0}, "optim.lars.eta"), ("lamb", {"eps": 3.0}, "optim.lamb.eps"),
                          ("lamb", {"beta2": 1.0}, "optim.lamb.beta2")):
        with pytest.raises(ConfigError, match=rf"^config {re.escape(key)}: must be in "):
            make_optimizer(m, name, lr=0.1, **kw)
        with pytest.raises(ConfigError, match=rf"^config {re.escape(key)}: must be in "):
            validate(from_set([f"optim.name={name}", f"{key}={next(iter(kw.values()))}"]))
