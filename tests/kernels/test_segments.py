"""Segments walked by the CPU references: every element exactly once, at its buffer offset."""
import pytest
import torch

from hpctrain.kernels._segments import segments


@pytest.mark.parametrize("sizes, chunk, run_below", [
    ([], 8, 8), ([0], 8, 8), ([3, 0, 4, 10, 2, 2, 25, 1], 8, 8), ([8, 8], 8, 8), ([7, 1, 1], 8, 8),
    ([1] * 20, 8, 8), ([100], 7, 7), ([3, 5, 2, 9, 1, 1], 8, 4), ([2, 2, 2], 8, 1),
])
def test_segments_tile_the_buffer(sizes, chunk, run_below):
    total = sum(sizes)
    tensors = [torch.arange(n, dtype=torch.float32) for n in sizes]
    flat = torch.cat(tensors + [torch.zeros(0)])
    rebuilt = torch.full((total,), -1.0)
    covered = 0
    for offset, n, parts in segments(tensors, chunk, run_below):
        assert 0 < n <= chunk and sum(p.numel() for p in parts) == n
        assert all(p.numel() < run_below for p in parts) or len(parts) == 1
        rebuilt[offset:offset + n] = torch.cat(parts)
        covered += n
    assert covered == total and torch.equal(rebuilt, flat)


def test_parts_are_views_of_the_tensors():
    tensors = [torch.zeros(3), torch.zeros(2, 2)]
    for _, _, parts in segments(tensors, 16):
        for p in parts:
            p.fill_(5.0)
    assert all(bool((t == 5).all()) for t in tensors)


def test_small_tensors_share_a_segment_and_large_ones_do_not():
    tensors = [torch.zeros(n) for n in (2, 3, 50, 4, 1)]
    got = [[p.numel() for p in parts] for _, _, parts in segments(tensors, 64, run_below=10)]
    assert got == [[2, 3], [50], [4, 1]]
