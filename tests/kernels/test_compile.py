"""Every CUDA source compiles for V100/A100/H100 targets with no error and no warning.

NVRTC (from the CUDA extra) compiles without a GPU; nvcc is the fallback, and is also run on a
subset when both exist. The broken and warning sources prove the check can fail.
"""
import pytest

from hpctrain import kernels
from hpctrain.kernels import offline_compile as oc
from hpctrain.kernels._prelude import PRELUDE

NVRTC, NVRTC_REASON = oc.nvrtc_status()
NVCC = oc.nvcc_path()
NVCC_TARGETS = oc.nvcc_targets(NVCC) if NVCC else set()
PRIMARY = "nvrtc" if NVRTC is not None else ("nvcc" if NVCC else None)
NO_COMPILER = f"no CUDA compiler: {NVRTC_REASON}; nvcc not on PATH"

BROKEN = PRELUDE + r"""
extern "C" __global__ void broken(float* x) { x[threadIdx.x] = undeclared_symbol; }
"""
WARNS = PRELUDE + r"""
extern "C" __global__ void warns(float* x) { int unused_variable; x[threadIdx.x] = 1.0f; }
"""


def compile_with(compiler, source, name, target):
    if compiler is None:
        pytest.skip(NO_COMPILER)
    if compiler == "nvrtc":
        return oc.compile_nvrtc(source, name, target)
    if target not in NVCC_TARGETS:
        pytest.skip(f"{NVCC} does not support {target} (CUDA 13 dropped compute_70)")
    return oc.compile_nvcc(source, name, target)


def cases():
    for name in kernels.SOURCES:
        for target in oc.TARGETS:
            yield pytest.param(PRIMARY, name, target, id=f"{PRIMARY}-{name}-{target}")
        if PRIMARY == "nvrtc" and NVCC:  # the fallback path, kept honest on a subset
            for target in ("compute_80", "sm_90"):
                yield pytest.param("nvcc", name, target, id=f"nvcc-{name}-{target}")


@pytest.mark.parametrize("compiler, name, target", list(cases()))
def test_source_compiles_cleanly(compiler, name, target):
    binary = compile_with(compiler, kernels.SOURCES[name], name, target)
    if target.startswith("compute_"):
        text = binary.decode()
        assert f".target {target.replace('compute', 'sm')}" in text
        assert f".entry {name}(" in text  # extern "C": the launcher finds it by this name
    else:
        assert binary[:4] == b"\x7fELF"


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
@pytest.mark.parametrize("source, name", [(BROKEN, "broken"), (WARNS, "warns")])
def test_bad_source_fails(compiler, source, name):
    if compiler == "nvrtc" and NVRTC is None:
        pytest.skip(NVRTC_REASON)
    if compiler == "nvcc" and NVCC is None:
        pytest.skip("nvcc not on PATH")
    with pytest.raises(oc.CompileError) as info:
        compile_with(compiler, source, name, "compute_80")
    assert ("undeclared_symbol" if name == "broken" else "unused_variable") in info.value.log


def test_only_the_known_deprecation_line_is_ignored():
    benign = oc.BENIGN_LOG_LINES[0]
    assert oc.significant_log(f"{benign}\n\n") == ""
    warning = "k.cu(3): warning #177-D: x"
    assert oc.significant_log(f"{benign}\n{warning}") == warning
    assert oc.significant_log(benign.replace("_75", "_80")) != ""


def test_command_line_reports_every_kernel(capsys):
    if PRIMARY is None:
        pytest.skip(NO_COMPILER)
    assert oc.main(["--compiler", PRIMARY]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(" ok (" in ln for ln in lines) >= len(kernels.SOURCES) * 4
