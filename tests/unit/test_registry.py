"""The plugin seam (hpctrain/config/registries.py): registration sets the name, a clash or an unknown name
is one line naming the key and the choices, and ``module:name`` imports a plugin file."""
import sys

import pytest

from hpctrain.job.args import config_from_args
from hpctrain.job.config import ConfigError, validate
from hpctrain.config.registries import Registry


def test_register_names_the_plugin_and_keeps_order():
    reg = Registry("demo.kind", "thing", sort_choices=False)

    @reg.register("b")
    class B:
        pass

    @reg.register("a")
    def a():
        return 1

    assert B.name == "b" and a.name == "a"
    assert reg.names() == ("b", "a") and list(reg) == ["b", "a"] and len(reg) == 2
    assert reg.get("a") is a and reg["b"] is B and "a" in reg and "c" not in reg
    with pytest.raises(ValueError) as err:
        reg.get("c")
    assert str(err.value) == "demo.kind: unknown thing 'c' (choose from b, a)"
    with pytest.raises(KeyError):
        reg["c"]
    reg.register("a")(a)                                # the same object again: harmless
    with pytest.raises(ValueError, match=r"^demo.kind: thing 'a' is registered twice \(.*\.a and .*\.other\)$"):
        @reg.register("a")
        def other():
            pass


def test_module_colon_name_imports_the_plugin_file(tmp_path, monkeypatch):
    reg = Registry("demo.kind", "thing")
    monkeypatch.setattr(sys.modules[__name__], "DEMO", reg, raising=False)
    (tmp_path / "demo_plugin_mod.py").write_text(
        f"from {__name__} import DEMO\n\n@DEMO.register('x')\ndef x():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "demo_plugin_mod:x" in reg and reg.get("demo_plugin_mod:x")() == 42 and reg.names() == ("x",)
    assert "demo_plugin_mod:y" not in reg and "no_such_mod_xyz:x" not in reg
    with pytest.raises(ValueError, match=r"^demo.kind: plugin 'demo_plugin_mod:y': demo_plugin_mod registers no "
                                         r"thing 'y' here$"):
        reg.get("demo_plugin_mod:y")
    with pytest.raises(ValueError, match=r"^demo.kind: plugin 'no_such_mod_xyz:x': cannot import 'no_such_mod_xyz'"):
        reg.get("no_such_mod_xyz:x")


def test_config_accepts_a_plugin_module_and_names_a_bad_one(plugin_sandbox):
    cfg = config_from_args(["--set", "comm.compression=examples.plugins.bf16_codec:bf16", "--run-dir", "/nonexistent/r"])
    validate(cfg)
    cfg = config_from_args(["--set", "comm.compression=examples.plugins.bf16_codec:bf8", "--run-dir", "/nonexistent/r"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value) == ("config comm.compression: plugin 'examples.plugins.bf16_codec:bf8': "
                              "examples.plugins.bf16_codec registers no compression 'bf8' here")
