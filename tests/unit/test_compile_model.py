"""``model.compile``'s start-up side: in place (same module, same state_dict keys), a bad mode
or a missing C++ compiler is one line naming the key. Nothing here runs a compiled forward (the
job tests in tests/mpi/test_compile_job.py do)."""
import pytest

from hpctrain.errors import ConfigError
from hpctrain.job.config import Config, set_value, validate
from hpctrain.models import build_model
from hpctrain.models.compiled import compile_model


def test_compile_in_place_keeps_the_module_and_refuses_a_bad_mode():
    model = build_model("digits_cnn", num_classes=10, in_channels=1)
    keys = list(model.state_dict())
    assert compile_model(model, "default") is model and list(model.state_dict()) == keys
    with pytest.raises(ConfigError, match="model.compile_mode"):
        compile_model(model, "fastest")


def test_no_cpp_compiler_is_one_line_at_start_up(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(ConfigError, match="model.compile: torch.compile on a CPU needs a C\\+\\+ compiler"):
        compile_model(build_model("digits_cnn", num_classes=10, in_channels=1), "default")


def test_the_config_names_the_modes():
    cfg = Config()
    set_value(cfg, "model.compile", "true")
    set_value(cfg, "model.compile_mode", "max-autotune")
    validate(cfg)
    set_value(cfg, "model.compile_mode", "fastest")
    with pytest.raises(ConfigError, match="model.compile_mode"):
        validate(cfg)
