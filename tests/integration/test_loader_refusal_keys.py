"""The loader refuses a window or prefetch too large for memory naming its own argument
(``train_loader prefetch: ...``); the job says which config key set it. The one line a user sees
names the key, as for any config error (the CLI's entry in process)."""
import dataclasses
import inspect
import re

import pytest

from hpctrain.data.factory import train_loader
from hpctrain.data.memory import LoaderTooLarge
from hpctrain.job.config import Config, set_value
from hpctrain.job.schema import DataConfig
from hpctrain.job.setup import LOADER_KEYS, loader_keywords
from tests.integration.inprocess import run_cli


@pytest.mark.parametrize("key,value,argument", [
    ("data.shuffle_window", "1000000000", "shuffle_window"),
    ("data.prefetch", "100000000", "prefetch"),
])
def test_a_loader_too_large_is_refused_naming_the_config_key(tmp_path, capsys, digits_dir, key, value, argument):
    r = run_cli(capsys, "--set", f"{key}={value}", "--data", digits_dir,
                "--run-dir", str(tmp_path / "run"), "--epochs", "1", "--no-progress")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert re.fullmatch(rf"hpctrain: error: config {re.escape(key)}: .* GiB per rank .*; choose a smaller value",
                        lines[0]), lines[0]
    assert f"train_loader {argument}" not in r.stderr        # the library's name stays below the job


def test_every_loader_argument_the_job_passes_has_its_key_and_reads_it():
    """The explicit convention kept honest: each ``train_loader`` argument but the index, the topology,
    the split and ``raw`` is passed, read from the key :data:`LOADER_KEYS` names for it (each value
    set apart here, so a keyword read from the wrong field or left out fails)."""
    params = set(inspect.signature(train_loader).parameters) - {"index", "topo", "split", "raw"}
    assert set(LOADER_KEYS) == params
    data_keys = {f"data.{f.name}" for f in dataclasses.fields(DataConfig)} - {"data.dataset", "data.cache_dir"}
    assert data_keys <= set(LOADER_KEYS.values())         # every [data] option reaches the loader
    cfg = Config()
    distinct = {"block_size": 7, "shuffle_window": 5, "prefetch": 0, "lanes": 6, "augment": True, "drop_last": False,
                "augment_kind": "flip", "augment_flip": False, "reader": "node", "hdf5_driver": "serial",
                "verify": "off", "workers": 3, "decode": "cpu", "seed": 2, "batch_size": 12}
    for argument, key in LOADER_KEYS.items():
        set_value(cfg, key, distinct[argument])
    seen = loader_keywords(cfg, ranks=2, normalise_on_device=True)
    assert seen == {**distinct, "batch_size": 6, "raw": True}


def test_the_loader_names_its_argument_not_a_config_key():
    class Index:
        sample_shape, dtype = (1, 8, 8), "float32"
    from hpctrain.data.memory import check_loader_memory
    with pytest.raises(LoaderTooLarge) as info:
        check_loader_memory(Index(), batch_size=32, shuffle_window=1024, prefetch=10**6, available=8 << 30)
    assert info.value.argument == "prefetch" and "data." not in str(info.value)
    assert str(info.value) == f"train_loader prefetch: {info.value.detail}"
