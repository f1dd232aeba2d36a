"""Which ``precision.compute`` runs on which device (the rules the trainer and the job share)."""
import contextlib

import torch

from hpctrain.trainer import compute_unsupported

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def fake_gpu(monkeypatch, bf16: bool):
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla V100-SXM2-32GB")


def test_cpu_runs_fp32_and_bf16_but_not_fp16():
    assert compute_unsupported("fp32", CPU) is None and compute_unsupported("bf16", CPU) is None
    assert "fp16 compute needs a CUDA device" in compute_unsupported("fp16", CPU)


def test_gpu_runs_fp16_always_and_bf16_where_supported(monkeypatch):
    fake_gpu(monkeypatch, bf16=True)
    assert all(compute_unsupported(c, CUDA) is None for c in ("fp32", "fp16", "bf16"))
    fake_gpu(monkeypatch, bf16=False)
    assert compute_unsupported("fp16", CUDA) is None
    assert "bf16 compute is not supported by Tesla V100" in compute_unsupported("bf16", CUDA)
