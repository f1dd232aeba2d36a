"""The GPU tests' expected start-up lines (tests/gpu_expect.py) against the real describe()."""
import types

import pytest
import torch

from hpctrain.comm import compression
from hpctrain.comm.base import GradSync
from tests.gpu_expect import direct_route_text


def bare_sync(n_ranks: int, device: torch.device) -> GradSync:
    """A GradSync with one unstaged bucket on ``device`` (no MPI, no buffers of real size)."""
    sync = object.__new__(GradSync)
    buf = torch.empty(4, device=device)
    sync.buckets = [types.SimpleNamespace(staging=None, bufs=[buf, buf], n_elems=4)]
    sync.comm = types.SimpleNamespace(Get_size=lambda: n_ranks)
    sync.codec = compression.get("none")
    sync.overlap, sync.measured = False, {}
    return sync


@pytest.mark.parametrize("n_ranks", [1, 2, 4])
def test_direct_route_text_is_what_describe_says(n_ranks):
    device = torch.device("meta")       # not "cpu": describe() treats it as device memory
    line = bare_sync(n_ranks, device).describe()
    assert direct_route_text(n_ranks, device) in line, line
    other = direct_route_text(1 if n_ranks > 1 else 2, device)
    assert other not in line
