"""Direct reads of contiguous HDF5 datasets: ``os.preadv`` at the offset HDF5 reports.

A shard's ``x`` and ``y`` are written with the contiguous layout (no chunks, no filters), so
samples ``[lo, hi)`` are the bytes ``offset + lo*row .. offset + hi*row`` of the file
(``H5Dget_offset``, h5py ``DatasetID.get_offset``). Reading them with one ``preadv`` into the
loader's buffer is one kernel copy, like ``cat``, and runs without the GIL — h5py holds it for
the whole ``H5Dread`` — so the loader thread does not stall the training thread. Datasets that
are chunked, filtered, non-native-endian or variable-length (JPEG) are read through h5py; so is
everything with the ``mpio`` driver.
"""
from __future__ import annotations

import os

import h5py
import numpy as np


class DirectExtent:
    """The raw bytes of one contiguous dataset in an open file descriptor."""

    def __init__(self, fd: int, offset: int, row_bytes: int, n_rows: int):
        self.fd, self.offset, self.row_bytes, self.n_rows = fd, offset, row_bytes, n_rows

    @classmethod
    def of(cls, ds: h5py.Dataset, path: str, fd: int) -> DirectExtent | None:
        """The extent of ``ds``, or None when it cannot be read directly."""
        if ds.chunks is not None or ds.dtype.hasobject or not ds.dtype.isnative or ds.shape[0] == 0:
            return None
        offset = ds.id.get_offset()
        if offset is None:
            return None
        row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
        return cls(fd, int(offset), row_bytes, ds.shape[0])

    def end(self) -> int:
        return self.offset + self.row_bytes * self.n_rows

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """``(file offset, bytes)`` of rows ``[lo, hi)``."""
        return self.offset + lo * self.row_bytes, (hi - lo) * self.row_bytes

    def read_into(self, lo: int, hi: int, out: np.ndarray) -> None:
        """Rows ``[lo, hi)`` into the C-contiguous ``out`` (exactly ``hi - lo`` rows)."""
        pos, want = self.span(lo, hi)
        pread_full(self.fd, memoryview(out).cast("B")[:want], pos)  # type: ignore[arg-type]  # numpy stub: buffers only on 3.12+


def pread_full(fd: int, view: memoryview, pos: int) -> None:
    """Fill ``view`` with the file's bytes from ``pos`` (``preadv`` until done; short file: OSError)."""
    done, want = 0, len(view)
    while done < want:
        got = os.preadv(fd, [view[done:]], pos + done)
        if got <= 0:
            raise OSError(f"short read: {done} of {want} bytes at offset {pos}")
        done += got
