"""CIFAR-10/100 "python version" batches, read with a restricted unpickler.

The official files (Krizhevsky 2009, https://www.cs.toronto.edu/~kriz/cifar.html) are Python 2
pickles of dicts holding a uint8 ``data`` array (N, 3072) and label lists. A pickle can name any
importable callable and have it called while loading (``__reduce__``), so a file from the
internet must not go to ``pickle.load``: :class:`SafeUnpickler` resolves only the three NumPy
callables an ndarray pickle needs (and a latin-1-only ``_codecs.encode``, which protocol-2
pickles written by Python 3 use for bytes) and refuses every other global before anything runs (the
approach the ``pickle`` docs recommend under "Restricting Globals"). Dicts, lists, strings and
numbers are pickle opcodes, not globals, so they need no permission.

SRC is the extracted folder (``cifar-10-batches-py`` / ``cifar-100-python``) or the ``.tar.gz``.
"""
from __future__ import annotations

import io
import os
import pickle
import tarfile
from typing import Any

import numpy as np

from .sources import Source, SourceError, from_arrays, source

CIFAR10: dict[str, Any] = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"],
                           "meta": "batches.meta", "labels": "labels", "names": "label_names"}
CIFAR100: dict[str, Any] = {"train": ["train"], "test": ["test"], "meta": "meta", "labels": "fine_labels",
                            "names": "fine_label_names"}


class UnsafePickleError(SourceError):
    """The pickle asked for a global outside the allow-list; nothing was called."""


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles from Python 3 use it for bytes, latin-1 only."""
    if encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"refused _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


def _allowed_globals() -> dict:
    """The callables of an ndarray pickle, under the module names old and new NumPy write."""
    reconstruct = np.zeros(1).__reduce__()[0]        # numpy(._)core.multiarray._reconstruct
    scalar = np.float64(0).__reduce__()[0]           # numpy(._)core.multiarray.scalar
    allowed = {}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(mod, "_reconstruct")] = reconstruct
        allowed[(mod, "scalar")] = scalar
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    allowed[("_codecs", "encode")] = _latin1_encode
    return allowed


class SafeUnpickler(pickle.Unpickler):
    _ALLOWED = _allowed_globals()

    def __init__(self, fh, origin: str):
        super().__init__(fh, encoding="latin1")      # Python 2 str → str, as NumPy's docs advise
        self.origin = origin

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(f"{self.origin}: refused to unpickle global {module}.{name} "
                                    f"(only NumPy arrays and plain containers are allowed)") from None


def safe_load(data: bytes, origin: str) -> Any:
    try:
        return SafeUnpickler(io.BytesIO(data), origin).load()
    except UnsafePickleError as exc:
        if str(exc).startswith(origin):
            raise
        raise UnsafePickleError(f"{origin}: {exc}") from None
    except Exception as exc:  # any malformed pickle: one line naming the file
        raise SourceError(f"{origin}: not a readable CIFAR pickle ({type(exc).__name__}: {exc})") from None


def _reader(src: str):
    """``read(name) -> bytes`` for files of the folder or the tarball."""
    if os.path.isdir(src):
        def read(name):
            path = os.path.join(src, name)
            if not os.path.isfile(path):           # isfile: a FIFO or device would block the open
                raise SourceError(f"{path}: missing CIFAR file (or not a regular file)")
            with open(path, "rb") as fh:
                return fh.read()
        return read
    if os.path.isfile(src) and tarfile.is_tarfile(src):
        tar = tarfile.open(src)
        members = {os.path.basename(m.name): m for m in tar.getmembers() if m.isfile()}

        def read(name):
            if name not in members:
                raise SourceError(f"{src}: missing CIFAR file {name} in the archive")
            fh = tar.extractfile(members[name])
            assert fh is not None       # members are regular files
            return fh.read()
        return read
    raise SourceError(f"{src}: not a CIFAR folder or .tar.gz")


def _batch(read, name: str, labels_key: str, origin: str):
    d = safe_load(read(name), f"{origin}/{name}")
    if not isinstance(d, dict) or "data" not in d or labels_key not in d:
        raise SourceError(f"{origin}/{name}: expected a dict with 'data' and {labels_key!r}")
    x, y = d["data"], np.asarray(d[labels_key])
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072:
        raise SourceError(f"{origin}/{name}: 'data' must be uint8 (N, 3072), got "
                          f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    if len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
        raise SourceError(f"{origin}/{name}: {len(x)} images but {len(y)} labels of type {y.dtype}")
    return x.reshape(-1, 3, 32, 32), y.astype(np.int64)


@source("cifar")
def load_cifar(src: str | None, *, size=None, encode="raw", class_names=None, **_) -> Source:
    """CIFAR-10 or CIFAR-100 (told apart by their file names); 32×32 RGB, train and test splits."""
    if not src:
        raise SourceError("cifar: give the cifar-10-batches-py / cifar-100-python folder or its .tar.gz")
    read = _reader(src)
    try:
        read(CIFAR10["meta"])
        layout = CIFAR10
    except SourceError:
        layout = CIFAR100
    meta = safe_load(read(layout["meta"]), f"{src}/{layout['meta']}")
    names = class_names or ([str(n) for n in meta.get(layout["names"], [])] if isinstance(meta, dict) else None)
    if not names:
        raise SourceError(f"{src}/{layout['meta']}: no {layout['names']!r} list")
    splits = {}
    for split in ("train", "test"):
        parts = [_batch(read, name, layout["labels"], src) for name in layout[split]]
        splits[split] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return from_arrays(splits, names, src, size=size, encode=encode)
