"""Host side of the multi-tensor table read by the CUDA kernels (layout in `_prelude.PRELUDE`).

Pure NumPy, so the chunk arithmetic is unit-tested without a GPU.
"""
import numpy as np

from ._prelude import CHUNK_ELEMS


def build_table(addresses, n_elems, chunk_elems=CHUNK_ELEMS) -> tuple[np.ndarray, int]:
    """Return `(table int64[4n + c], n_chunks)` for tensors at `addresses` with `n_elems` each.

    Empty tensors get no chunk (the kernels never see them), so `n_chunks` may be 0.
    """
    addr = np.asarray(addresses, dtype=np.uint64).view(np.int64)
    sizes = np.asarray(n_elems, dtype=np.int64)
    n_tensors = sizes.size
    flat_offsets = np.cumsum(sizes) - sizes
    per_tensor = (sizes + chunk_elems - 1) // chunk_elems
    if per_tensor.size and per_tensor.max() >= 2**32:
        raise ValueError("a tensor has more than 2**32 chunks")
    first_chunk = np.cumsum(per_tensor) - per_tensor
    n_chunks = int(per_tensor.sum())
    owner = np.repeat(np.arange(n_tensors, dtype=np.int64), per_tensor)
    index_in_tensor = np.arange(n_chunks, dtype=np.int64) - np.repeat(first_chunk, per_tensor)
    entries = (owner << 32) | index_in_tensor
    table = np.concatenate([addr, flat_offsets, sizes, first_chunk, entries]).astype(np.int64)
    return table, n_chunks


def decode_chunk(table, n_tensors, chunk, chunk_elems=CHUNK_ELEMS) -> tuple[int, int, int]:
    """Python mirror of `hpc_chunk` in the CUDA prelude: `(tensor, begin, end)` of one chunk."""
    entry = int(table[4 * n_tensors + chunk])
    tensor = entry >> 32
    begin = (entry & 0xFFFFFFFF) * chunk_elems
    end = min(begin + chunk_elems, int(table[2 * n_tensors + tensor]))
    return tensor, begin, end
