"""MNIST / Fashion-MNIST IDX files (raw or gzip).

IDX (LeCun et al., http://yann.lecun.com/exdb/mnist/): two zero bytes, a type code, the number
of dimensions, each dimension as a big-endian int32, then the data big-endian in C order. SRC is
a folder with ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``
and ``t10k-labels-idx1-ubyte``, each optionally ``.gz`` (the names both datasets use).
"""
from __future__ import annotations

import gzip
import os

import numpy as np

from .sources import Source, SourceError, from_arrays, source

IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def parse_idx(data: bytes, origin: str) -> np.ndarray:
    """Decode one IDX file's bytes; every inconsistency is one SourceError naming the file."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise SourceError(f"{origin}: not an IDX file (bad magic number)")
    code, ndim = data[2], data[3]
    if code not in IDX_TYPES:
        raise SourceError(f"{origin}: unknown IDX type code 0x{code:02x}")
    head = 4 + 4 * ndim
    if len(data) < head:
        raise SourceError(f"{origin}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(data, ">i4", count=ndim, offset=4))
    dtype = IDX_TYPES[code]
    want = int(np.prod(dims)) * dtype.itemsize
    if len(data) - head != want:
        raise SourceError(f"{origin}: IDX header says {dims} ({want} bytes of data), file has {len(data) - head}")
    return np.frombuffer(data, dtype, offset=head).reshape(dims).astype(dtype.newbyteorder("="))


def read_idx(path: str) -> np.ndarray:
    for candidate in (path, path + ".gz"):
        if os.path.isfile(candidate):                  # isfile: a FIFO or device would block the open
            try:
                with (gzip.open if candidate.endswith(".gz") else open)(candidate, "rb") as fh:
                    return parse_idx(fh.read(), candidate)
            except (OSError, EOFError) as exc:
                raise SourceError(f"{candidate}: unreadable ({exc})") from None
    raise SourceError(f"{path}[.gz]: missing IDX file (or not a regular file)")


@source("mnist")
def load_mnist(src: str | None, *, size=None, encode="raw", class_names=None, **_) -> Source:
    """MNIST or Fashion-MNIST (class names of Fashion-MNIST when the folder name says 'fashion')."""
    if not src or not os.path.isdir(src):
        raise SourceError(f"{src}: not an MNIST folder")
    splits = {}
    for split, (images, labels) in FILES.items():
        x = read_idx(os.path.join(src, images))
        y = read_idx(os.path.join(src, labels))
        if x.ndim != 3 or x.dtype != np.uint8:
            raise SourceError(f"{os.path.join(src, images)}: expected uint8 (N, H, W) images, got {x.dtype} {x.shape}")
        if y.ndim != 1 or len(y) != len(x):
            raise SourceError(f"{os.path.join(src, labels)}: {y.shape} labels for {len(x)} images")
        splits[split] = (x[:, None], y.astype(np.int64))
    fashion = "fashion" in os.path.basename(os.path.abspath(src)).lower()
    names = class_names or (FASHION if fashion else [str(i) for i in range(10)])
    return from_arrays(splits, names, src, size=size, encode=encode)
