"""load_model and export for a user's own model factory, in process: a run directory laid out as
the job writes it (model.json from run_spec, a checkpoint file), the model rebuilt from
``package.module:factory`` or ``path/to/file.py:factory`` and compared with the one saved."""
import json
import os
import types

import pytest
import torch

from hpctrain.ops.checkpoint import checkpoint_name, encode, write_file
from hpctrain.ops.ckptfile import REQUIRED
from hpctrain.saved import SavedModelError, load_model
from hpctrain.saved.export import export
from hpctrain.saved.spec import SPEC_NAME, run_spec, write_spec
from tests.integration.fixtures import seqmodels

FIXTURE_FILE = os.path.abspath(seqmodels.__file__)


def fake_run(run_dir, model_name, model, run_id="r1", step=7):
    index = types.SimpleNamespace(num_classes=4, sample_shape=(24,), dtype="float32", encoding="raw",
                                  normalize={"mean": [0.0], "std": [1.0]}, class_names=list("abcd"))
    config = {"model": {"name": model_name, "batchnorm": True, "zero_init_residual": False},
              "data": {"dataset": "/nowhere", "cache_dir": "~/.cache/hpctrain"}}
    ckdir = os.path.join(run_dir, "checkpoints")
    os.makedirs(ckdir)
    write_spec(os.path.join(run_dir, SPEC_NAME), run_spec(config, index, run_id, ckdir, run_dir))
    # a checkpoint as the Checkpointer writes it: what export reads, and the fields resume needs
    payload = {**dict.fromkeys(REQUIRED, 0), "trainer": {"model": model.state_dict()}, "step": step}
    write_file(os.path.join(ckdir, checkpoint_name(step)), encode(payload),
               {"step": step, "run_id": run_id, "leg": 0, "samples_seen": step})


@pytest.mark.parametrize("name", ["tests.integration.fixtures.seqmodels:build", f"{FIXTURE_FILE}:build"])
def test_a_users_factory_is_rebuilt_with_its_weights(tmp_path, name):
    torch.manual_seed(3)
    trained = seqmodels.build(num_classes=4, in_channels=24)
    fake_run(str(tmp_path / "run"), name, trained)
    x = torch.randn(5, 24)
    export(str(tmp_path / "run"), str(tmp_path / "out" / "m.pt"))
    for loaded in (load_model(str(tmp_path / "run")), load_model(str(tmp_path / "out" / "m.pt"))):
        assert not loaded.training
        with torch.no_grad():
            assert torch.equal(loaded(x), trained(x))
    assert json.load(open(tmp_path / "out" / "m.json"))["model"] == name


def test_a_relative_file_spec_is_recorded_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(os.path.dirname(FIXTURE_FILE))
    fake_run(str(tmp_path / "run"), "seqmodels.py:build", seqmodels.build(4, 24))
    monkeypatch.chdir(tmp_path)
    assert json.load(open(tmp_path / "run" / SPEC_NAME))["model"] == f"{FIXTURE_FILE}:build"
    load_model(str(tmp_path / "run"))


def test_weights_of_another_model_are_one_line(tmp_path):
    fake_run(str(tmp_path / "run"), "tests.integration.fixtures.seqmodels:wrong_classes",
             seqmodels.build(4, 24))
    with pytest.raises(SavedModelError, match=r"^model 'tests\.integration\.fixtures\.seqmodels:wrong_classes' "
                                              r"does not take these weights: "):
        load_model(str(tmp_path / "run"))


def test_another_runs_checkpoints_are_not_taken(tmp_path):
    fake_run(str(tmp_path / "run"), "tests.integration.fixtures.seqmodels:build", seqmodels.build(4, 24))
    spec = json.load(open(tmp_path / "run" / SPEC_NAME))
    spec["run_id"] = "another"
    json.dump(spec, open(tmp_path / "run" / SPEC_NAME, "w"))
    with pytest.raises(SavedModelError, match="no checkpoint of run"):
        load_model(str(tmp_path / "run"))


def test_a_compiled_models_entries_load_into_the_plain_model(tmp_path):
    """torch.compile's wrapper (``OptimizedModule``) holds the model as ``_orig_mod``, so every entry
    is prefixed ``_orig_mod.``; the exported model is the plain one. (A module holding it the same way
    stands in: importing torch's compiler costs a serial test seconds.)"""
    trained = seqmodels.build(4, 24)
    compiled = torch.nn.Module()
    compiled._orig_mod = trained
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    fake_run(str(tmp_path / "run"), "tests.integration.fixtures.seqmodels:build", compiled)
    x = torch.randn(3, 24)
    with torch.no_grad():
        assert torch.equal(load_model(str(tmp_path / "run"))(x), trained(x))


def test_a_run_directory_moved_elsewhere_finds_its_checkpoints(tmp_path):
    fake_run(str(tmp_path / "run"), "tests.integration.fixtures.seqmodels:build", seqmodels.build(4, 24))
    os.rename(tmp_path / "run", tmp_path / "moved")
    load_model(str(tmp_path / "moved"))
