"""Segments walked by the CPU references: every element exactly once, at its buffer offset."""
import pytest
import torch

from kernels._segments import segments


@pytest.mark.parametrize("sizes, chunk", [
    ([], 8), ([0], 8), ([3, 0, 4, 10, 2, 2, 25, 1], 8), ([8, 8], 8), ([7, 1, 1], 8),
    ([1] * 20, 8), ([100], 7),
])
def test_segments_tile_the_buffer(sizes, chunk):
    total = sum(sizes)
    tensors = [torch.arange(n, dtype=torch.float32) for n in sizes]
    flat = torch.cat(tensors + [torch.zeros(0)])
    rebuilt = torch.full((total,), -1.0)
    covered = 0
    for offset, n, parts in segments(tensors, chunk):
        assert 0 < n <= chunk and sum(p.numel() for p in parts) == n
        assert (len(parts) == 1) or all(p.numel() < chunk for p in parts)
        rebuilt[offset:offset + n] = torch.cat(parts)
        covered += n
    assert covered == total and torch.equal(rebuilt, flat)


def test_parts_are_views_of_the_tensors():
    tensors = [torch.zeros(3), torch.zeros(2, 2)]
    for _, _, parts in segments(tensors, 16):
        for p in parts:
            p.fill_(5.0)
    assert all(bool((t == 5).all()) for t in tensors)
