"""Writing shard files: in chunks to a temporary name, renamed into place when complete
(:mod:`hpctrain.fileio`)."""
from __future__ import annotations

import os

import h5py
import numpy as np

from hpctrain.data.index import FORMAT, VERSION, ShardError, file_sha256, shard_name
from hpctrain.fileio import commit, discard, temp_path


class ShardWriter:
    """Write one shard in chunks to a temporary name; :meth:`finish` renames it and returns its entry.

    ``x`` chunks are (n, ...) arrays for ``raw``, sequences of 1-D uint8 arrays (encoded images)
    for ``jpeg``. Datasets use the contiguous layout (no chunking): a range read is one extent.
    A writer that is not finished (an error, a kill) leaves only its hidden ``.tmp-PID`` file behind.
    """

    def __init__(self, directory: str, split: str, i: int, n: int, num_samples: int,
                 sample_shape: tuple, dtype, encoding: str = "raw"):
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
        return {"file": self.name, "num_samples": self.num_samples, "sha256": file_sha256(self.path)}

    def abort(self) -> None:
        self.fh.close()
        discard(self.tmp)


def write_shard(directory: str, split: str, i: int, n: int, x, y: np.ndarray, encoding: str = "raw") -> dict:
    """Write one whole shard atomically; returns its index entry."""
    shape = () if encoding == "jpeg" else np.shape(x)[1:]
    w = ShardWriter(directory, split, i, n, len(y), shape, None if encoding == "jpeg" else x.dtype, encoding)
    try:
        w.write(x, y)
    except BaseException:
        w.abort()
        raise
    return w.finish()
