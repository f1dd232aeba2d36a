"""Issue 17's friction list: a shape hint naming the fix, --model path/to/file.py:factory, the
effective lr said with its reason, one version (data_tools parts: test_data_friction.py)."""
import configparser
import os
import subprocess
import sys
import types

import pytest
import torch

from hpctrain.models import ModelError, build_model, resolve, shape_hint
from hpctrain.optim.schedules import describe_lr, spec_from_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- shape hint -----------------------------------------------------------------------------------
def test_shape_hint_names_the_channel_axis_for_1d_samples():
    conv = torch.nn.Conv1d(40, 8, 3)
    with pytest.raises(RuntimeError) as exc:
        conv(torch.zeros(2, 40))              # what (N, 40) data feeds a model built with in_channels=40
    hint = shape_hint((40,), exc.value)
    assert "in_channels=40" in hint and "(N, 1, 40)" in hint and "x[:, None, :]" in hint


def test_shape_hint_channels_last_images_and_nothing_for_good_shapes():
    assert "x.transpose(0, 3, 1, 2)" in shape_hint((32, 32, 3), "expected input to have 32 channels")
    assert "(N, 3, 32, 32)" in shape_hint((32, 32, 3), "")
    assert shape_hint((3, 32, 32), "mat1 and mat2 shapes cannot be multiplied") == ""
    assert "(N, 1, 28, 28)" in shape_hint((28, 28), "expected input[2, 28, 28] to have 1 channels")


# --- --model path/to/file.py:factory ---------------------------------------------------------------
MODEL_FILE = '''
import torch
def build(num_classes, in_channels):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))
NOT_A_MODEL = "x"
'''


def test_model_from_a_file_path(tmp_path, monkeypatch):
    f = tmp_path / "sub" / "mymodel.py"
    f.parent.mkdir()
    f.write_text(MODEL_FILE)
    m = build_model(f"{f}:build", num_classes=3, in_channels=1)
    assert m(torch.zeros(2, 1, 5)).shape == (2, 3)
    monkeypatch.chdir(tmp_path)
    assert resolve("sub/mymodel.py:build") is resolve(f"{f}:build")      # relative to cwd, imported once
    with pytest.raises(ModelError, match="no such file 'sub/nope.py'"):
        resolve("sub/nope.py:build")
    with pytest.raises(ModelError, match="has no attribute 'missing'"):
        resolve("sub/mymodel.py:missing")
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(ModelError, match="cannot import 'broken.py'.*ModuleNotFoundError"):
        resolve("broken.py:build")


# --- describe_lr -----------------------------------------------------------------------------------
def optim(**kw):
    base = dict(lr=0.1, base_batch=256, scale_lr=True, name="sgd")
    return types.SimpleNamespace(**{**base, **kw})


def test_describe_lr_states_number_and_reason():
    assert describe_lr(optim(), 64) == ("lr 0.025 = 0.1 x 64/256 (optim.scale_lr; set optim.scale_lr=false "
                                        "to use 0.1 as given)")
    assert describe_lr(optim(scale_lr=False), 64) == "lr 0.1 as given (optim.scale_lr=false)"
    assert "MLPerf LARS" in describe_lr(optim(lr=None, name="lars"), 4096)
    for o, b in [(optim(), 64), (optim(lr=0.4, base_batch=128), 1024), (optim(scale_lr=False), 8)]:
        peak = spec_from_config(lr=o.lr, global_batch=b, steps_per_epoch=10, epochs=1, warmup_epochs=0,
                                base_batch=o.base_batch, scale_lr=o.scale_lr).peak_lr
        assert describe_lr(o, b).startswith(f"lr {peak:g} ")


# --- one version -------------------------------------------------------------------------------------
def test_version_flag_prints_the_package_version():
    import hpctrain
    r = subprocess.run([sys.executable, "-m", "hpctrain", "--version"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 0 and r.stdout == f"hpctrain {hpctrain.__version__}\n"
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    assert cfg["metadata"]["version"] == "attr: hpctrain.__version__"    # the one place
    from importlib.metadata import version
    assert version("hpctrain") == hpctrain.__version__
