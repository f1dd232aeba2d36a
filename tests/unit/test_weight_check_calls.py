"""The weight check's fixed cost per tensor: no conversion call for a sum already in fp32 (a
behaviour, counted), and the verdict the same for every dtype (against NumPy's isfinite)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hpctrain.optim.loss_scale import finite_flag


def count_to_calls(monkeypatch) -> list:
    calls: list = []
    original = torch.Tensor.to

    def counted(self, *args, **kwargs):
        calls.append(self.dtype)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counted)
    return calls


def test_fp32_weights_are_checked_without_a_conversion_per_tensor(monkeypatch):
    weights = [torch.randn(5, 3), torch.randn(3), torch.randn(7, 2)]
    calls = count_to_calls(monkeypatch)
    assert bool(finite_flag(weights)) is True
    assert calls == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")])
def test_the_verdict_is_numpys_for_every_dtype(dtype, bad):
    weights = [torch.randn(4, 3).to(dtype), torch.randn(6, dtype=torch.float32)]
    if bad is not None:
        weights[0][1, 2] = bad
    want = all(np.isfinite(w.float().numpy()).all() for w in weights)
    assert bool(finite_flag(weights)) is want
