"""Plugin options in sub-tables (``[sync.odsgd]``, schema = the plugin's constructor) and renamed
keys (old spelling read as the new key, one deprecation line each): both spellings give the same
config, a bad sub-table key or value is one line naming it, ``--help`` lists what the registries
hold, and reading a config imports no torch."""
import inspect
import re
import subprocess
import sys
from typing import Annotated  # noqa: F401  (read by a string annotation below)

import pytest

from hpctrain.cli import config_from_args
from hpctrain.config import RENAMED, Config, ConfigError, deprecation_lines, help_text, load_toml, validate
from hpctrain.config.values import NON_NEGATIVE, Option

OLD_TOML = """
[sync]
algorithm = "odsgd"
odsgd_warmup_steps = 7
odsgd_local_lr = 0.05
odsgd_local_momentum = 0.5
odsgd_dc_lambda = 0.1
comm_delay_ms = 3
[optim]
lars_exclude_1d = false
lars_eta = 0.002
lars_eps = 1e-8
lars_clip = true
lamb_beta2 = 0.99
lamb_eps = 1e-7
"""
NEW_TOML = """
[sync]
algorithm = "odsgd"
[sync.odsgd]
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
OLD_SET = ["sync.algorithm=odsgd", "sync.odsgd_warmup_steps=7", "sync.odsgd_local_lr=0.05",
           "sync.odsgd_local_momentum=0.5", "sync.odsgd_dc_lambda=0.1", "sync.comm_delay_ms=3",
           "optim.lars_exclude_1d=false", "optim.lars_eta=0.002", "optim.lars_eps=1e-8", "optim.lars_clip=true",
           "optim.lamb_beta2=0.99", "optim.lamb_eps=1e-7"]
NEW_SET = ["sync.algorithm=odsgd", "sync.odsgd.warmup_steps=7", "sync.odsgd.local_lr=0.05",
           "sync.odsgd.local_momentum=0.5", "sync.odsgd.dc_lambda=0.1", "comm.delay_ms=3", "optim.exclude_1d=false",
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


def test_old_and_new_spellings_give_identical_configs(tmp_path):
    from hpctrain import update as update_lib
    configs = [from_toml(tmp_path, OLD_TOML), from_toml(tmp_path, NEW_TOML), from_set(OLD_SET), from_set(NEW_SET)]
    for cfg in configs:
        assert cfg == configs[0] and cfg.to_dict() == configs[0].to_dict()
    cfg = configs[0]
    assert (cfg.comm.delay_ms, cfg.optim.exclude_1d) == (3.0, False)
    assert update_lib.algorithm_options(cfg.sync) == {"warmup_steps": 7, "local_lr": 0.05, "local_momentum": 0.5,
                                                    "dc_lambda": 0.1}
    # the dump (metrics.jsonl, checkpoints) spells the sub-table as a TOML file does
    assert cfg.to_dict()["sync"] == {"algorithm": "odsgd", "odsgd": {"warmup_steps": 7, "local_lr": 0.05,
                                                                     "local_momentum": 0.5, "dc_lambda": 0.1}}


def test_algorithm_options_default_to_the_constructors():
    from hpctrain import update as update_lib
    from hpctrain.update import ODSGD
    defaults = {k: p.default for k, p in inspect.signature(ODSGD).parameters.items()
                if k in ("warmup_steps", "local_lr", "local_momentum", "dc_lambda")}
    assert update_lib.algorithm_options(from_set(["sync.algorithm=odsgd"]).sync) == defaults
    assert update_lib.algorithm_options(from_set(["sync.odsgd.warmup_steps=3"]).sync) == {}    # ssgd: none


def test_one_deprecation_line_per_old_key_naming_old_and_new(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(OLD_TOML)
    cfg = config_from_args(["--config", str(f), *[a for item in OLD_SET for a in ("--set", item)]])
    lines = deprecation_lines(cfg)
    assert len(lines) == len(RENAMED) == 11                  # each old key given twice, named once
    for old, new in RENAMED.items():
        assert sum(f" {old} " in x and f" {new} " in x for x in lines) == 1, (old, lines)
    assert all(x.startswith("hpctrain: warning: config ") for x in lines)
    assert deprecation_lines(from_toml(tmp_path, NEW_TOML)) == [] == deprecation_lines(from_set(NEW_SET))


@pytest.mark.parametrize("items,message", [
    (["sync.odsgd.nope=1"], "config sync.odsgd.nope: unknown key (odsgd's options: warmup_steps, local_lr, "
                            "local_momentum, dc_lambda)"),
    (["sync.ring.x=1"], "config sync.ring.x: unknown key (sub-tables of [sync]: odsgd)"),
    (["sync.odsgd.warmup_steps=1.5"], "config sync.odsgd.warmup_steps: expected int, got '1.5'"),
    (["sync.odsgd.local_lr=nan"], "config sync.odsgd.local_lr: expected a finite float, got 'nan'"),
    (["sync.odsgd.local_momentum=1"], "config sync.odsgd.local_momentum: must be in [0, 1), got 1.0"),
    (["sync.odsgd_local_momentum=1"], "config sync.odsgd_local_momentum: must be in [0, 1), got 1.0"),  # as given
    (["comm.delay_ms=-1"], "config comm.delay_ms: must be in [0, 60000], got -1.0"),
    (["sync.comm_delay_ms=-1"], "config sync.comm_delay_ms: must be in [0, 60000], got -1.0"),
    (["sync.options=1"], "config sync.options: unknown key"),
    (["optim.lars.eta=0"], "config optim.lars.eta: must be in (0, 1], got 0.0"),
    (["optim.lars_eta=0"], "config optim.lars_eta: must be in (0, 1], got 0.0"),                 # as given
    (["optim.lamb.beta2=1.5"], "config optim.lamb.beta2: must be in [0, 1), got 1.5"),
    (["optim.lars.clip=maybe"], "config optim.lars.clip: expected bool, got 'maybe'"),
    (["optim.adam.eps=1e-8"], "config optim.adam.eps: unknown key (sub-tables of [optim]: lars, lamb)"),
    (["optim.sgd.eta=0.1"], "config optim.sgd.eta: unknown key (sgd's options: none)"),
    (["comm.fp16.x=1"], "config comm.fp16.x: unknown key (fp16's options: none)"),
    (["sync.mod:odsgd.x=1"], "config sync.mod:odsgd.x: unknown key (name the sub-table by the plugin's registered "
                             "name, odsgd)"),
])
def test_bad_sub_table_key_or_value_names_it(items, message):
    with pytest.raises(ConfigError) as err:
        validate(from_set(items + ["run.run_dir=/nonexistent/run"]))
    assert str(err.value) == message


def test_toml_sub_table_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^config sync\.odsgd\.warmup_steps: expected int, got 'many'$"):
        from_toml(tmp_path, '[sync.odsgd]\nwarmup_steps = "many"\n')


def test_help_lists_plugin_options_and_registry_choices(plugin_sandbox):
    text = help_text()
    assert "  sync.odsgd.warmup_steps = 200\n      plain SSGD for the first N steps (must be >= 0)" in text
    assert "  sync.odsgd.local_momentum = 0.0\n" in text and "sync.odsgd_warmup_steps ->" in text
    assert "  optim.lars.eta = 0.001\n      LARS trust coefficient eta (must be in (0, 1])" in text
    assert "  optim.lamb.beta2 = 0.999\n" in text and "optim.lars_eta -> optim.lars.eta" in text
    assert "      optimiser: sgd | lars | lamb\n" in text and "{choices}" not in text
    import examples.plugins.adamw_optimizer  # noqa: F401  registers adamw
    assert "      optimiser: sgd | lars | lamb | adamw\n" in help_text()


def test_reading_a_config_imports_no_torch():
    code = ("import sys; from hpctrain.cli import config_from_args; "
            "cfg = config_from_args(['--set', 'optim.lars_exclude_1d=false', '--set', 'comm.delay_ms=1']); "
            "print('torch' in sys.modules, 'mpi4py.MPI' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]


# --- a data or optimiser option is written in its section and its function's signature, no adapter line ---
def test_every_data_field_but_the_datasets_is_a_loader_keyword():
    import dataclasses

    from hpctrain.config import DataConfig
    from hpctrain.data.factory import train_loader
    fields = {f.name for f in dataclasses.fields(DataConfig)}
    assert fields - set(inspect.signature(train_loader).parameters) == {"dataset", "cache_dir"}   # job._data_index


def test_loader_adapter_passes_each_field_by_its_name(monkeypatch):
    import functools

    from hpctrain.config import DataConfig
    from hpctrain.data import factory
    seen = {}

    @functools.wraps(factory.train_loader)
    def record(index, topo, **kw):
        seen.update(kw)
    monkeypatch.setattr(factory, "train_loader", record)
    d = DataConfig(block_size=7, shuffle_window=5, prefetch=0, augment=True, drop_last=False, augment_kind="flip",
                   augment_flip=False, reader="node", hdf5_driver="serial", verify="off", workers=3, decode="cpu")
    factory.train_loader_from_config(None, None, d, batch_size=3, seed=2)
    assert seen == dict(block_size=7, shuffle_window=5, prefetch=0, augment=True, drop_last=False, augment_kind="flip",
                        augment_flip=False, reader="node", hdf5_driver="serial", verify="off", batch_size=3, seed=2,
                        raw=False, workers=3, decode="cpu")


def test_optimiser_adapter_passes_each_field(monkeypatch):
    import functools

    import hpctrain.optim as optim_lib
    seen = {}

    @functools.wraps(optim_lib.make_optimizer)
    def record(params_or_model, name, lr, **kw):
        seen.update(kw, name=name, lr=lr)
    monkeypatch.setattr(optim_lib, "make_optimizer", record)
    o = from_set(["optim.name=lamb", "optim.lr=0.3", "optim.momentum=0.8", "optim.weight_decay=0.01",
                  "optim.nesterov=true", "optim.exclude_1d=false", "optim.lars_eta=0.002", "optim.lars_eps=1e-8",
                  "optim.lars_clip=true", "optim.lr_1d_scale=0.5", "optim.lamb_beta2=0.99",
                  "optim.lamb_eps=1e-7"]).optim
    optim_lib.optimizer_from_config([], o)
    assert seen == dict(name="lamb", lr=0.3, momentum=0.8, weight_decay=0.01, nesterov=True, exclude_1d=False,
                        lr_1d_scale=0.5, beta2=0.99, eps=1e-7)           # the chosen optimiser's own options
    o.name = "lars"
    optim_lib.optimizer_from_config([], o)
    assert {k: seen[k] for k in ("name", "eta", "eps", "clip")} == dict(name="lars", eta=0.002, eps=1e-8, clip=True)


def test_recompute_bn_stats_is_exported_and_polish_bn_is_its_alias():
    import hpctrain
    from hpctrain.polish import recompute_bn_stats
    assert hpctrain.recompute_bn_stats is recompute_bn_stats is hpctrain.polish_bn
    assert {"recompute_bn_stats", "polish_bn"} <= set(hpctrain.__all__)


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
    from hpctrain.data.builtin import resolve_dataset
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
    with pytest.raises(ConfigError, match=r"^config data\.dataset: plugin 'no_such_module_x:ramp': cannot import"):
        validate(from_set(["data.dataset=no_such_module_x:ramp", f"run.run_dir={tmp_path / 'run'}"]))
    validate(from_set([f"data.dataset={tmp_path}", f"run.run_dir={tmp_path / 'run'}"]))   # a directory is not


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
    for key in ("sync.odsgd.warmup_steps = 200", "sync.odsgd.dc_lambda = 0.0", "comm.delay_ms = 0.0",
                "optim.exclude_1d = True", "optim.lars_exclude_1d -> optim.exclude_1d",
                "optim.lars.eta = 0.001\n      LARS trust coefficient eta (must be in (0, 1])"):
        assert key in r.stdout, key


def test_old_names_read_in_python_warn_and_are_no_fields():
    """``cfg.optim.lars_eta`` (an old key within its section) reads the new key's value, as the
    plugin will be built, with a DeprecationWarning; setting it sets the new key; ``==``, ``asdict`` and
    ``to_dict`` (hence the run record) see only the new keys, without a warning."""
    import dataclasses
    import warnings
    cfg = from_set(NEW_SET)
    with pytest.warns(DeprecationWarning, match=r"^config optim\.lars_eta is deprecated: use optim\.lars\.eta$"):
        assert cfg.optim.lars_eta == 0.002
    with pytest.warns(DeprecationWarning, match="sync.odsgd_warmup_steps"):
        assert cfg.sync.odsgd_warmup_steps == 7
    with pytest.warns(DeprecationWarning, match="optim.lars_exclude_1d"):
        assert cfg.optim.lars_exclude_1d is False
    with pytest.warns(DeprecationWarning, match="optim.lamb_eps"):
        assert Config().optim.lamb_eps == 1e-6                     # not given: the constructor's default
    with pytest.warns(DeprecationWarning, match="optim.lars_eta"):
        cfg.optim.lars_eta = 0.5                                  # sets the new key
    assert cfg.optim.options["lars"]["eta"] == 0.5
    cfg.optim.options["lars"]["eta"] = 0.002
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cfg == from_set(OLD_SET) and cfg.to_dict() == from_set(OLD_SET).to_dict()
        assert not {"lars_eta", "lamb_eps", "lars_exclude_1d"} & set(dataclasses.asdict(cfg)["optim"])
        validate(from_set(NEW_SET + ["run.run_dir=/nonexistent/run"]))
        help_text()


def test_old_names_as_constructor_keywords_set_the_new_keys():
    """``OptimConfig(lars_eta=...)`` (Python code written before the rename) builds the same
    section as the new key, with a DeprecationWarning; a key that moved to another section is one
    line saying where."""
    from hpctrain.config import CommConfig, OptimConfig, SyncConfig
    with pytest.warns(DeprecationWarning) as said:
        old = OptimConfig(lars_eta=0.002, lars_exclude_1d=False, lr=0.1)
    assert sorted(str(w.message) for w in said) == ["config optim.lars_eta is deprecated: use optim.lars.eta",
                                                    "config optim.lars_exclude_1d is deprecated: use optim.exclude_1d"]
    assert {w.filename for w in said} == {__file__}                     # pointing at the caller's line
    assert old == OptimConfig(options={"lars": {"eta": 0.002}}, exclude_1d=False, lr=0.1)
    with pytest.warns(DeprecationWarning, match="sync.odsgd_warmup_steps"):
        assert SyncConfig(algorithm="odsgd", odsgd_warmup_steps=3) == SyncConfig("odsgd", {"odsgd": {"warmup_steps": 3}})
    with pytest.raises(AttributeError, match=r"^config sync\.comm_delay_ms moved to another section: use "
                                             r"cfg\.comm\.delay_ms$"):
        SyncConfig(comm_delay_ms=1.0)
    with pytest.raises(AttributeError, match="use cfg.comm.delay_ms"):
        Config().sync.comm_delay_ms
    assert CommConfig(delay_ms=1.0).delay_ms == 1.0


def test_record_holds_every_option_the_chosen_plugins_run_with():
    """The run record (``to_dict``) says what ran: the chosen algorithm's and optimiser's options
    with their defaults (read from the constructors here, independently), the others as given."""
    import inspect

    from hpctrain.optim import OPTIMIZERS
    from hpctrain.update import ODSGD
    cfg = from_set(["sync.algorithm=odsgd", "sync.odsgd.warmup_steps=3", "optim.name=lars", "optim.lamb.beta2=0.9"])
    rec = cfg.to_dict()
    defaults = {k: p.default for k, p in inspect.signature(ODSGD).parameters.items()
                if k in ("warmup_steps", "local_lr", "local_momentum", "dc_lambda")}
    assert rec["sync"]["odsgd"] == {**defaults, "warmup_steps": 3}
    lars = inspect.signature(OPTIMIZERS.get("lars")).parameters
    assert rec["optim"]["lars"] == {k: lars[k].default for k in ("eta", "eps", "clip")}
    assert rec["optim"]["lamb"] == {"beta2": 0.9}                         # not chosen: as given
    assert "odsgd" not in Config().to_dict()["sync"] and "lars" not in Config().to_dict()["optim"]


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
