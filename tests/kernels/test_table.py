"""The multi-tensor chunk table read by the CUDA kernels, checked on the host."""
import numpy as np
import pytest

from hpctrain.kernels._table import build_table, decode_chunk


@pytest.mark.parametrize("sizes, chunk", [
    ([], 4), ([0, 0], 4), ([1], 4), ([4], 4), ([5], 4), ([3, 0, 9, 4, 1], 4),
    ([16384 * 3 + 1, 7, 16384], 16384),
])
def test_chunks_cover_every_element_once(sizes, chunk):
    addresses = [0x7F00_0000_0000 + 4096 * i for i in range(len(sizes))]
    table, n_chunks = build_table(addresses, sizes, chunk)
    n = len(sizes)
    assert table.dtype == np.int64 and table.size == 4 * n + n_chunks
    assert n_chunks == sum(-(-s // chunk) for s in sizes)
    np.testing.assert_array_equal(table[:n].view(np.uint64), addresses)
    np.testing.assert_array_equal(table[n:2 * n], np.cumsum([0] + sizes)[:n])
    np.testing.assert_array_equal(table[2 * n:3 * n], sizes)
    seen = [np.zeros(s, int) for s in sizes]
    for c in range(n_chunks):
        tensor, begin, end = decode_chunk(table, n, c, chunk)
        assert 0 < end - begin <= chunk
        seen[tensor][begin:end] += 1
        first = table[3 * n + tensor]
        assert first <= c < first + -(-sizes[tensor] // chunk)  # the tensor's chunks are contiguous
    assert all((s == 1).all() for s in seen)


def test_high_addresses_survive_the_int64_view():
    table, _ = build_table([2**63 + 8], [1])
    assert int(table[:1].view(np.uint64)[0]) == 2**63 + 8
