"""How many passes the hierarchical node sum makes over a bucket's slice, counted as torch ops
(a behaviour, not a timing): the maths against NumPy, the op count against the design."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hpctrain.comm.fused import CHUNK_ELEMS, sum_into


class PassCount(TorchDispatchMode):
    """Counts the aten ops run under it that touch a tensor of more than 1000 elements (a pass
    over data; views and scalars aside), by name, in place or not (``add.out`` and
    ``add_.Tensor``: add)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0].rstrip("_")
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if name not in ("slice", "lift_fresh", "alias") and any(t.numel() > 1000 for t in tensors):
            self.ops[name] += 1
        return func(*args, **kwargs)


def node_sum(n_srcs, n_elems, **kw):
    rng = np.random.default_rng(n_srcs)
    srcs = [rng.standard_normal(n_elems).astype(np.float32) for _ in range(n_srcs)]
    out, other = torch.empty(n_elems), torch.empty(n_elems)
    with PassCount() as count:
        found = sum_into([torch.from_numpy(s) for s in srcs], out, 0.5, copies=[other], check=True, **kw)
    want = srcs[0].copy()
    for s in srcs[1:]:
        want += s
    want *= np.float32(0.5)
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(other.numpy(), want)
    assert found is False
    return count.ops


def test_two_sources_are_summed_in_one_pass_of_each_kind():
    ops = node_sum(2, 4 * CHUNK_ELEMS + 2000)      # five chunks' worth
    assert ops == {"add": 1, "mul": 1, "copy": 1, "sum": 1}


@pytest.mark.parametrize("n_srcs", [3, 4])
def test_more_sources_are_summed_chunk_by_chunk(n_srcs):
    ops = node_sum(n_srcs, 2 * CHUNK_ELEMS + 2000)  # three chunks: the output chunk stays in cache
    assert ops == {"add": 3 * (n_srcs - 1), "mul": 3, "copy": 3, "sum": 3}


def test_an_explicit_chunk_is_kept():
    assert node_sum(2, 5 * 4096, chunk=4096)["add"] == 5


def test_a_non_finite_mean_is_found_in_the_whole_pass():
    srcs = [torch.ones(3 * CHUNK_ELEMS), torch.ones(3 * CHUNK_ELEMS)]
    srcs[1][-1] = float("nan")
    assert sum_into(srcs, torch.empty(3 * CHUNK_ELEMS), 0.5, check=True) is True
