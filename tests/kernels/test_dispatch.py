"""Dispatch layer: backend report, import without CuPy, array kinds."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from hpctrain import kernels


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_public_api():
    assert set(kernels.__all__) == {"SOURCES", "backend", "lars_update", "multi_tensor_sq_norms",
                                    "pack_fp16", "unpack_fp16"}
    assert set(kernels.SOURCES) == {"hpc_pack_fp16", "hpc_unpack_fp16", "hpc_sq_norms",
                                    "hpc_lars_update"}


def test_backend_reports_cpu_with_reason_here():
    kind, reason = kernels.backend()
    if kind == "cuda":
        pytest.skip(f"a GPU is present: {reason}")
    assert kind == "cpu" and ("not installed" in reason or "no CUDA device" in reason)


BLOCK_CUPY = "import sys; sys.modules['cupy'] = None\n"


def test_import_without_cupy_is_silent_and_works():
    run = run_python(BLOCK_CUPY + (
        "import torch\nfrom hpctrain import kernels\n"
        "out = torch.empty(3, dtype=torch.float16)\n"
        "flag = kernels.pack_fp16([torch.ones(3)], out, 2.0)\n"
        "assert out.tolist() == [2.0, 2.0, 2.0] and not flag\n"
        "kind, reason = kernels.backend()\n"
        "assert kind == 'cpu' and 'cupy not installed' in reason, reason\n"))
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and run.stderr == ""


def test_cuda_array_without_cupy_names_the_extra():
    run = run_python(BLOCK_CUPY + (
        "from hpctrain import kernels\n"
        "class FakeCupy:\n"
        "    __cuda_array_interface__ = {}\n"
        "try:\n"
        "    kernels.multi_tensor_sq_norms([FakeCupy()])\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"))
    assert run.returncode == 0, run.stderr
    assert "hpctrain[cuda]" in run.stdout


def test_unknown_array_type_rejected():
    with pytest.raises(TypeError):
        kernels.multi_tensor_sq_norms([[1.0, 2.0]])


def test_numpy_and_torch_give_identical_bits():
    a = np.random.default_rng(6).standard_normal(5000).astype(np.float32) * 1e4
    out_np = np.empty(5000, np.float16)
    out_t = torch.empty(5000, dtype=torch.float16)
    kernels.pack_fp16([a], out_np, 7.0)
    kernels.pack_fp16([torch.from_numpy(a)], out_t, 7.0)
    np.testing.assert_array_equal(out_np.view(np.uint16), out_t.numpy().view(np.uint16))
