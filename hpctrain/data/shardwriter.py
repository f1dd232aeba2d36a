"""Writing shard files: in chunks to a temporary name, renamed into place when complete
(:mod:`hpctrain.ops.fileio`); the entry carries the file's SHA-256 and its per-block digests (index v5:
a grid aligned with the sample rows)."""
from __future__ import annotations

import os

import h5py
import numpy as np

from hpctrain.data.index import (
    BLOCK_BYTES,
    BLOCK_DIGEST,
    FORMAT,
    VERSION,
    BlockGrid,
    ShardError,
    aligned_grid,
    data_block_ranges,
    file_digests,
    shard_name,
)
from hpctrain.ops.fileio import commit, discard, temp_path


class ShardWriter:
    """Write one shard in chunks to a temporary name; :meth:`finish` renames it and returns its entry.

    ``x`` chunks are (n, ...) arrays for ``raw``, sequences of 1-D uint8 arrays (encoded images)
    for ``jpeg``. Datasets use the contiguous layout (no chunking): a range read is one extent.
    A writer that is not finished (an error, a kill) leaves only its hidden ``.tmp-PID`` file behind.
    """

    def __init__(self, directory: str, split: str, i: int, n: int, num_samples: int,
                 sample_shape: tuple, dtype, encoding: str = "raw", block_bytes: int = BLOCK_BYTES,
                 digest: str = BLOCK_DIGEST):
        self.block_bytes, self.digest = int(block_bytes), digest
        self.name = shard_name(split, i, n)
        self.path = os.path.join(directory, self.name)
        self.tmp = temp_path(self.path)
        self.num_samples, self.encoding, self.pos = int(num_samples), encoding, 0
        self.fh = h5py.File(self.tmp, "w")
        if encoding == "jpeg":
            self.x = self.fh.create_dataset("x", shape=(num_samples,), dtype=h5py.vlen_dtype(np.uint8))
        else:
            self.x = self.fh.create_dataset("x", shape=(num_samples, *sample_shape), dtype=np.dtype(dtype))
        self.y = self.fh.create_dataset("y", shape=(num_samples,), dtype=np.int64)
        self.fh.attrs.update({"format": FORMAT, "version": VERSION, "split": split, "shard": i})

    def write(self, x, y) -> None:
        n = len(y)
        if self.encoding == "jpeg":
            for k, blob in enumerate(x):       # one by one: h5py reads equal-length blobs as a 2-D array
                self.x[self.pos + k] = np.frombuffer(blob, np.uint8) if isinstance(blob, bytes) else blob
        elif n:
            self.x[self.pos:self.pos + n] = x
        if n:
            self.y[self.pos:self.pos + n] = np.asarray(y).astype(np.int64)
        self.pos += n

    def finish(self) -> dict:
        if self.pos != self.num_samples:
            self.abort()
            raise ShardError(f"{self.path}: wrote {self.pos} samples, expected {self.num_samples}")
        self.fh.close()
        commit(self.tmp, self.path)
        return {"file": self.name, "num_samples": self.num_samples,
                **shard_digests(self.path, self.block_bytes, self.digest)}

    def abort(self) -> None:
        self.fh.close()
        discard(self.tmp)


def shard_digests(path: str, block_bytes: int = BLOCK_BYTES, digest: str = BLOCK_DIGEST) -> dict:
    """``sha256`` and ``blocks`` (block digests of kind ``digest``) of a finished shard's index
    entry, on the grid :func:`shard_grid` lays (SHA-256 blocks: the v3 grid from byte 0, so that
    ``--block-digest sha256`` keeps an index that hpctrain before v4 reads). The data ranges are
    the blocks wholly inside the contiguous storage of ``x`` and ``y`` (none for a variable-length
    ``x``; none at all for a file HDF5 cannot open: every block is then checked at open)."""
    grid, extents = shard_grid(path, block_bytes, digest)
    whole, blocks = file_digests(path, grid.block_bytes, digest, grid.origin)
    origin = {"origin": grid.origin} if grid.origin else {}      # absent: 0, an index v3/v4 entry
    return {"sha256": whole, "blocks": {"bytes": grid.block_bytes, "file_bytes": grid.file_bytes, **origin,
                                        digest: blocks, "data": data_block_ranges(extents, grid)}}


def shard_grid(path: str, block_bytes: int = BLOCK_BYTES,
               digest: str = BLOCK_DIGEST) -> tuple[BlockGrid, list[tuple[int, int]]]:
    """The digest grid of a shard file (:func:`~hpctrain.data.index.aligned_grid`: on the sample rows
    of a contiguous raw ``x``, about ``block_bytes``; ``block_bytes`` from byte 0 for SHA-256
    blocks, the v3 layout) and the ``(offset, n_bytes)`` extents of its contiguous datasets."""
    extents, start, row = [], None, 0
    try:
        with h5py.File(path, "r") as fh:
            for ds in (fh[k] for k in ("x", "y") if k in fh):
                offset = ds.id.get_offset() if ds.chunks is None and not ds.dtype.hasobject else None
                if offset is not None:
                    extents.append((int(offset), int(ds.id.get_storage_size())))
                    if ds.name == "/x" and ds.shape[0]:
                        start, row = int(offset), int(ds.id.get_storage_size()) // ds.shape[0]
    except OSError:
        extents = []
    if digest == "sha256":
        start = None
    return aligned_grid(block_bytes, os.path.getsize(path), start, row), extents


def write_shard(directory: str, split: str, i: int, n: int, x, y: np.ndarray, encoding: str = "raw",
                block_bytes: int = BLOCK_BYTES, digest: str = BLOCK_DIGEST) -> dict:
    """Write one whole shard atomically; returns its index entry."""
    shape = () if encoding == "jpeg" else np.shape(x)[1:]
    w = ShardWriter(directory, split, i, n, len(y), shape, None if encoding == "jpeg" else x.dtype, encoding,
                    block_bytes, digest)
    try:
        w.write(x, y)
    except BaseException:
        w.abort()
        raise
    return w.finish()
