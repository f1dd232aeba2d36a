"""Source readers: each turns a dataset on disk into a :class:`Source` the writer converts.

A reader is registered by name (``@source("NAME")``, chosen by ``--from NAME``; every reader
module is listed once, in ``readers.py``) and returns a :class:`Source`: per split a sample
count and a ``read(lo, hi)`` that materialises samples ``[lo, hi)`` only, so a rank of a parallel
conversion touches nothing but its own shards. Array sources (digits, npz, CIFAR, MNIST) are
small enough to hold in memory; ImageFolder decodes files lazily (``imagefolder.py``).
Images are ``(N, C, H, W)``; any other ``(N, ...)`` array converts too (no resize/JPEG then).

Input is untrusted: every limit is checked before the memory it guards is allocated, and a
violation is one :class:`SourceError` naming the file. Labels are 1-D integers in
``0..MAX_CLASSES-1``; one sample (as decoded, after ``--size``) is at most ``MAX_SAMPLE_BYTES``;
samples are integer or real float arrays, finite unless ``allow_nonfinite`` (:mod:`samplechecks`);
an ``.npz`` is checked from its array headers before any array is read.
"""
from __future__ import annotations

import math
import os
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from hpctrain.config.registries import Registry

from .samplechecks import (
    MAX_CLASSES,
    MAX_SAMPLE_BYTES,
    SourceError,
    check_sample_bytes,
    check_samples,
    count_classes,
    held_out_count,
    train_test_split,
)

__all__ = ["MAX_CLASSES", "MAX_SAMPLE_BYTES", "SOURCES", "STORE_DTYPES", "Chunk", "Source", "SourceError",
           "SplitSource", "cast_source", "check_sample_bytes", "check_samples", "count_classes", "from_arrays",
           "held_out_count", "load_digits", "load_npz", "read_npz", "source", "train_test_split"]

# Filled by the reader modules as they are imported; data_tools/readers.py imports all of them.
SOURCES: Registry[Callable[..., Source]] = Registry("data source", "source")


Reader = TypeVar("Reader", bound="Callable[..., Source]")


def source(name: str) -> Callable[[Reader], Reader]:
    """Decorator: register a reader as ``--from name`` (the reader itself is returned, its
    signature kept)."""
    def deco(reader: Reader) -> Reader:
        SOURCES.register(name)(reader)
        return reader
    return deco


@dataclass
class Chunk:
    """Samples read from a source: ``x`` as stored, ``pixels`` as decoded (for channel statistics)."""
    x: object
    y: np.ndarray
    pixels: np.ndarray


@dataclass
class SplitSource:
    num_samples: int
    read: Callable[[int, int], Chunk]


@dataclass
class Source:
    """What the writer needs: splits, class names and the stored sample layout."""
    splits: dict[str, SplitSource]
    class_names: list[str]
    sample_shape: tuple
    dtype: str
    encoding: str = "raw"
    origin: str = ""                       # names the source in error messages
    extra: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)   # said after the "wrote" line (a split made here, a dtype)


def _is_image(shape: tuple) -> bool:
    return len(shape) == 3 and shape[0] in (1, 3)


def _resize_batch(x: np.ndarray, size: tuple) -> np.ndarray:
    from hpctrain.data.images import fit, pil, to_chw
    Image = pil()
    out = np.empty((len(x), x.shape[1], *size), np.uint8)
    for k, a in enumerate(x):
        img = Image.fromarray(a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0))
        out[k] = to_chw(fit(img, *size), a.shape[0])
    return out


def from_arrays(splits: dict, class_names: list, origin: str, *, size=None, encode: str = "raw",
                allow_nonfinite: bool = False) -> Source:
    """A :class:`Source` over in-memory ``{split: (x, y)}``; optional resize and JPEG encoding."""
    for name, (x, y) in splits.items():
        check_samples(np.asarray(x), f"{origin}: split {name}", allow_nonfinite)
        if len(x) != len(y):
            raise SourceError(f"{origin}: split {name}: {len(x)} samples but {len(y)} labels")
        y = np.asarray(y)
        if y.ndim != 1 or (y.size and not np.issubdtype(y.dtype, np.integer)):
            raise SourceError(f"{origin}: split {name}: labels must be a 1-D integer array, got {y.dtype} {y.shape}")
        bad = np.flatnonzero((y < 0) | (y >= len(class_names)))
        if bad.size:
            k = int(bad[0])
            raise SourceError(f"{origin}: split {name}: sample {k} has label {int(y[k])}, "
                              f"outside 0..{len(class_names) - 1}")
    first = next(iter(splits.values()))[0]
    shape, dtype = tuple(first.shape[1:]), first.dtype
    if (size or encode == "jpeg") and not (_is_image(shape) and dtype == np.uint8):
        raise SourceError(f"{origin}: --size/--encode jpeg need uint8 images (N, 1|3, H, W), got {dtype} {shape}")
    out_shape = (shape[0], *size) if size else shape

    def reader(x, y):
        def read(lo: int, hi: int) -> Chunk:
            px = _resize_batch(x[lo:hi], size) if size else x[lo:hi]
            if encode == "jpeg":
                from hpctrain.data.images import encode_jpeg
                return Chunk([encode_jpeg(p) for p in px], y[lo:hi], px)
            return Chunk(px, y[lo:hi], px)
        return read

    return Source({k: SplitSource(len(y), reader(x, np.asarray(y, np.int64))) for k, (x, y) in splits.items()},
                  list(class_names), out_shape, str(dtype), encode, origin)


@source("digits")
def load_digits(src: str | None, *, test_fraction: float = 0.2, seed: int = 0, size=None, encode="raw",
                **_) -> Source:
    """scikit-learn's bundled handwritten digits: 1,797 8×8 images, values 0..16, 10 classes."""
    from sklearn.datasets import load_digits as sk_digits
    d = sk_digits()
    x = d.images.astype(np.uint8)[:, None, :, :]   # (N, 1, 8, 8), values 0..16
    splits = train_test_split(x, d.target.astype(np.int64), test_fraction, seed, "digits")
    return from_arrays(splits, [str(c) for c in d.target_names], "digits", size=size, encode=encode)


def _memory_bytes() -> int:
    """Physical memory: an ``.npz`` whose arrays declare more cannot be converted here."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _npz_header(z: zipfile.ZipFile, member: str) -> tuple[tuple, np.dtype]:
    """``(shape, dtype)`` from a member's ``.npy`` header, without reading its data."""
    fmt = np.lib.format
    with z.open(member) as fh:
        version = fmt.read_magic(fh)
        if version not in ((1, 0), (2, 0)):      # 3.0 only adds UTF-8 field names: structured, refused anyway
            raise ValueError(f"unsupported .npy format version {version}")
        shape, _, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(fh)
    return shape, dtype


def _check_npz_headers(heads: dict, src: str) -> None:
    """Refuse from the headers alone: pickled objects, 0-d or oversized samples, a zip bomb."""
    for key, (shape, dtype) in heads.items():
        if dtype.hasobject:
            raise SourceError(f"{src}: array {key!r} holds Python objects (pickles are not loaded)")
        if key in ("x", "x_test") and not shape:
            raise SourceError(f"{src}: array {key!r} is 0-d {dtype}; need samples (N, ...)")
        if key in ("x", "x_test"):
            check_sample_bytes(shape[1:], dtype, f"{src}: array {key!r}")
    total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in heads.values())
    if total > _memory_bytes():
        raise SourceError(f"{src}: arrays declare {total / 2**30:,.1f} GiB, more than this machine's memory")


def read_npz(src: str | None) -> dict:
    """The arrays of an ``.npz``, every header checked before any data is read.

    Read with :mod:`zipfile` and ``np.lib.format`` (what ``np.load`` does) so the checks come
    first; a truncated or corrupt archive is one :class:`SourceError` naming the file.
    """
    if not src or not os.path.isfile(src):       # isfile: a FIFO or device would block the open
        raise SourceError(f"{src}: npz file not found (or not a regular file)")
    try:
        with zipfile.ZipFile(src) as z:
            members = {m[:-4]: m for m in z.namelist() if m.endswith(".npy")}
            _check_npz_headers({k: _npz_header(z, m) for k, m in members.items()}, src)
            arrays = {}
            for key, member in members.items():
                with z.open(member) as fh:
                    arrays[key] = np.lib.format.read_array(fh, allow_pickle=False)
            return arrays
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, RuntimeError, NotImplementedError) as exc:
        # RuntimeError: an encrypted member; NotImplementedError: an unknown compression method
        raise SourceError(f"{src}: not a readable .npz ({type(exc).__name__}: {exc})") from None


def _npz_test_file(arrays: dict, src: str, test_file: str) -> None:
    """Add ``x_test``/``y_test`` to ``arrays`` from a separate test ``.npz`` (its ``x``/``y``, or its
    own ``x_test``/``y_test`` if it holds only those)."""
    if "x_test" in arrays or "y_test" in arrays:
        raise SourceError(f"{src}: has its own x_test/y_test and a test file {test_file} was given too; "
                          f"use one of them")
    test = read_npz(test_file)
    xk, yk = ("x", "y") if "x" in test or "y" in test else ("x_test", "y_test")
    for key in (xk, yk):
        if key not in test:
            raise SourceError(f"{test_file}: missing array {key!r} (has {', '.join(test) or 'none'})")
    arrays["x_test"], arrays["y_test"] = test[xk], test[yk]


@source("npz")
def load_npz(src: str | None, *, test_fraction: float = 0.2, seed: int = 0, size=None, encode="raw",
             class_names=None, allow_nonfinite: bool = False, test_file: str | None = None, **_) -> Source:
    """A ``.npz`` with arrays ``x`` and ``y`` (and optionally ``x_test``, ``y_test``), or a train
    ``.npz`` plus a test ``.npz`` (``test_file``, its arrays ``x``/``y``). Without a test split a
    seeded ``test_fraction`` split is made, and said in :attr:`Source.notes`."""
    arrays = read_npz(src)
    assert src is not None      # read_npz raised otherwise
    for key in ("x", "y"):
        if key not in arrays:
            raise SourceError(f"{src}: missing array {key!r} (has {', '.join(arrays) or 'none'})")
    if test_file:
        _npz_test_file(arrays, src, test_file)
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise SourceError(f"{src}: 'x_test' and 'y_test' must come together")
    pairs = [("x", "y"), ("x_test", "y_test")] if "x_test" in arrays else [("x", "y")]
    for xk, _yk in pairs:                    # as stored, so a sample index is the file's, not the shuffled split's
        check_samples(arrays[xk], f"{src}: array {xk!r}", allow_nonfinite)
    n_classes = count_classes({f"array {yk!r}": arrays[yk] for _, yk in pairs}, src)
    for xk, yk in pairs:
        if len(arrays[xk]) != len(arrays[yk]):
            raise SourceError(f"{src}: {xk!r} has {len(arrays[xk])} samples but {yk!r} has {len(arrays[yk])}")
    if "x_test" in arrays:
        splits = {"train": (arrays["x"], arrays["y"]), "test": (arrays["x_test"], arrays["y_test"])}
        note = f"test split: {test_file}" if test_file else f"test split: x_test/y_test of {src}"
    else:
        splits = train_test_split(arrays["x"], arrays["y"], test_fraction, seed, src)
        n, n_test = len(arrays["y"]), len(splits["test"][1])
        note = (f"{src} has no test split (x_test/y_test): {n_test} of its {n} samples "
                f"({test_fraction:.0%}, --test-fraction, seed {seed}) were held out as the test split; "
                f"give a test file (--test-file TEST.npz) to use your own")
    for name, (x, _y) in splits.items():
        if x.shape[1:] != splits["train"][0].shape[1:] or x.dtype != splits["train"][0].dtype:
            raise SourceError(f"{src}: split {name} has {x.dtype} {x.shape[1:]}, train has "
                              f"{splits['train'][0].dtype} {splits['train'][0].shape[1:]}")
    names = class_names or [str(c) for c in range(n_classes)]
    # the finiteness scan ran above, on the arrays as stored: no second pass
    out = from_arrays(splits, names, src, size=size, encode=encode, allow_nonfinite=True)
    out.notes.append(note)
    return out


STORE_DTYPES = ("float32", "float16")


def cast_source(source: Source, dtype: str | None) -> Source:
    """Store float samples as ``dtype`` (``--dtype``); without one, a note when float64 is stored
    (twice the bytes of float32, which is what the model computes in anyway)."""
    if dtype is None:
        if source.dtype == "float64":
            source.notes.append("samples are stored as float64 (8 bytes a value, as given); the loader "
                                "feeds the model float32, so --dtype float32 halves the shards at no cost")
        return source
    if dtype not in STORE_DTYPES:
        raise SourceError(f"--dtype {dtype}: choose one of {', '.join(STORE_DTYPES)}")
    if np.dtype(source.dtype).kind != "f" or source.encoding != "raw":
        raise SourceError(f"{source.origin}: --dtype {dtype} converts float samples; these are "
                          f"{source.encoding} {source.dtype}")
    if source.dtype == dtype:
        return source
    if dtype == "float16":
        source.notes.append("float16 keeps about 3 significant digits and overflows above 65504; "
                            "check the data's range")

    def cast(read):
        def read_cast(lo: int, hi: int) -> Chunk:
            c = read(lo, hi)
            raw = np.asarray(c.x)
            with np.errstate(over="ignore"):
                x = raw.astype(dtype)
            if dtype == "float16" and not np.isfinite(x).all() and np.isfinite(raw).all():
                k = lo + int(np.flatnonzero(~np.isfinite(x).reshape(len(x), -1).all(axis=1))[0])
                raise SourceError(f"{source.origin}: sample {k} overflows float16 (|x| > 65504); "
                                  f"use --dtype float32")
            return Chunk(x, c.y, x)
        return read_cast

    source.notes.append(f"samples converted from {source.dtype} to {dtype} (--dtype)")
    source.splits = {k: SplitSource(s.num_samples, cast(s.read)) for k, s in source.splits.items()}
    source.dtype = dtype
    return source

