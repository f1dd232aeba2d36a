"""kernels/_runtime.py across CuPy 12/13/14 and CUDA 12/13 builds, with fake CuPy modules (no GPU)."""
import sys
import types

import pytest

from hpctrain.kernels import _runtime


class NVRTCError(Exception):
    """Named like CuPy's (cupy_backends.cuda.libs.nvrtc.NVRTCError)."""


def fake_cupy(version, runtime_version=12040, n_devices=1, available=True, from_external=True,
              external_stream=True, nvrtc_error=None):
    calls = []

    def raw_module(code, options=()):
        def get_function(name):      # CuPy compiles lazily: here, as the real one does
            calls.append(("compile", name))
            if nvrtc_error is not None:
                raise NVRTCError(nvrtc_error)
            return name
        return types.SimpleNamespace(get_function=get_function)

    class Stream:
        pass

    if from_external:
        Stream.from_external = staticmethod(lambda s: calls.append(("from_external", s)) or "protocol")
    cuda = types.SimpleNamespace(
        Stream=Stream,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: n_devices, runtimeGetVersion=lambda: runtime_version))
    if external_stream:
        cuda.ExternalStream = lambda ptr, dev: calls.append(("ExternalStream", ptr, dev)) or "external"
    return types.SimpleNamespace(__version__=version, cuda=cuda, is_available=lambda: available,
                                 RawModule=raw_module), calls


@pytest.fixture
def installed(monkeypatch):
    """``installed(fake)`` makes ``import cupy`` return ``fake`` for probe(); cache cleared around."""
    _runtime.probe.cache_clear()
    yield lambda fake: monkeypatch.setitem(sys.modules, "cupy", fake)
    _runtime.probe.cache_clear()


@pytest.mark.parametrize("text, major", [("14.2.0", 14), ("13.6.0rc1", 13), ("12.3.0", 12), ("dev", 0)])
def test_cupy_major(text, major):
    assert _runtime.cupy_major(text) == major


@pytest.mark.parametrize("runtime, want", [(12040, "12.4"), (12090, "12.9"), (13000, "13.0"), (13020, "13.2")])
def test_cuda_runtime_version(runtime, want):
    assert _runtime.cuda_runtime_version(fake_cupy("14.2.0", runtime)[0]) == want


def test_cuda_runtime_version_unknown_when_cupy_cannot_say():
    cupy, _ = fake_cupy("12.3.0")
    cupy.cuda.runtime.runtimeGetVersion = lambda: (_ for _ in ()).throw(RuntimeError("no driver"))
    assert _runtime.cuda_runtime_version(cupy) == "unknown"


@pytest.mark.parametrize("version, runtime", [("12.3.0", 12020), ("13.6.0", 13000), ("14.2.0", 12090),
                                              ("14.2.0", 13000)])
def test_probe_accepts_cupy_12_to_14_on_cuda_12_and_13(installed, version, runtime):
    cupy, _ = fake_cupy(version, runtime, n_devices=2)
    installed(cupy)
    got, reason = _runtime.probe()
    assert got is cupy
    assert reason == f"cupy {version} (CUDA {_runtime.cuda_runtime_version(cupy)}), 2 CUDA device(s)"


def test_probe_rejects_cupy_older_than_12_and_names_both_extras(installed):
    installed(fake_cupy("11.6.0")[0])
    got, reason = _runtime.probe()
    assert got is None and "older than 12" in reason
    assert "hpctrain[cuda]" in reason and "hpctrain[cuda13]" in reason


def test_probe_compiles_a_kernel_once(installed):
    cupy, calls = fake_cupy("14.2.0")
    installed(cupy)
    assert _runtime.probe()[0] is cupy and _runtime.probe()[0] is cupy
    assert calls == [("compile", "hpc_probe")]


def test_probe_falls_back_to_torch_when_nvrtc_cannot_compile(installed):
    """issue 34, N4: is_available() is True, but NVRTC fails: the torch path, said in one line."""
    cupy, calls = fake_cupy("14.2.0", nvrtc_error="NVRTC_ERROR_BUILTIN_OPERATION_FAILURE (7)\nlibnvrtc-builtins.so.13.0: cannot open")
    installed(cupy)
    got, reason = _runtime.probe()
    assert got is None and "\n" not in reason
    assert reason.startswith("cupy 14.2.0 cannot compile kernels (NVRTC compile failed: NVRTCError: ")
    assert reason.endswith("): torch path") and "libnvrtc-builtins" in reason
    from hpctrain import kernels
    assert kernels.backend() == ("cpu", reason)


def test_probe_without_a_device(installed):
    installed(fake_cupy("14.2.0", available=False)[0])
    assert _runtime.probe() == (None, "cupy 14.2.0 installed but no CUDA device (cupy.is_available() is False)")


class TorchStream:
    cuda_stream = 0xBEEF


class TorchStreamWithProtocol(TorchStream):
    def __cuda_stream__(self):
        return (0, self.cuda_stream)


def test_stream_protocol_where_both_sides_have_it():
    cupy, calls = fake_cupy("14.2.0")
    s = TorchStreamWithProtocol()
    assert _runtime._cupy_view_of(s, 3, cupy) == "protocol" and calls == [("from_external", s)]


@pytest.mark.parametrize("version, from_external, stream", [
    ("12.3.0", False, TorchStreamWithProtocol()),     # CuPy 12/13: no Stream.from_external
    ("13.6.0", False, TorchStream()),
    ("14.2.0", True, TorchStream()),                  # a torch stream without __cuda_stream__
])
def test_external_stream_otherwise(version, from_external, stream):
    cupy, calls = fake_cupy(version, from_external=from_external)
    assert _runtime._cupy_view_of(stream, 3, cupy) == "external"
    assert calls == [("ExternalStream", 0xBEEF, 3)]


def test_neither_stream_api_is_a_clear_error():
    cupy, _ = fake_cupy("15.0.0", from_external=False, external_stream=False)
    with pytest.raises(RuntimeError, match="cupy 15.0.0 has neither Stream.from_external"):
        _runtime._cupy_view_of(TorchStream(), 0, cupy)
