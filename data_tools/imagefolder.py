"""ImageFolder trees: one sub-folder per class of JPEG/PNG/BMP files (torchvision's layout).

``SRC/train/<class>/*`` with ``SRC/val/<class>/*`` (or ``test``), or ``SRC/<class>/*`` alone (a
seeded ``--test-fraction`` is held out). Class names are the train sub-folders, sorted. Files are
listed in sorted order and then shuffled with ``--seed``: a sorted listing groups a class together,
and the loader's block shuffle keeps blocks contiguous, so unshuffled shards would hand every
batch a few classes only. Images decode lazily, per range, so each rank of a parallel conversion
opens only its own files.

``--encode raw``: decoded to (3, H, W) uint8 — at ``--size H W`` (cover, centre-crop), or at the
common size of all images. ``--encode jpeg``: each *whole* image is stored, so the loader cuts
its crops from all of it at decode time (``hpctrain/data/crops.py``); ``--size`` is then the size
the loader decodes to. RGB and greyscale JPEG files keep their original bytes (no second lossy
step) unless ``--max-side N`` is given and their longer side exceeds ``N``: only those are
re-encoded, shrunk to ``N``; other formats (and CMYK JPEGs) are re-encoded whole. The index says
so (``"jpeg": {"stored": "whole", "max_side": N}``). Every image is decoded once here so an
unreadable one fails the conversion, not the training run.

Only regular files (or links to them) are opened: a FIFO named ``x.png`` would block the open
forever and a device could stream without end, so any other entry with an image extension is
refused at listing time, before anything is opened, and checked again just before decoding.
"""
from __future__ import annotations

import os
import stat

import numpy as np

from hpctrain.data import images

from .sources import Chunk, Source, SourceError, SplitSource, held_out_count, source

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")


def list_classes(root: str) -> list[str]:
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))


def refuse_irregular(path: str) -> None:
    """Raise unless ``path`` is a regular file or a link to one; never opens it (see the module doc)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise SourceError(f"{path}: cannot stat ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
                "a folder" if stat.S_ISDIR(mode) else "not a file")
        raise SourceError(f"{path}: {kind}, not a regular image file; remove or rename it")


def list_files(root: str, classes: list[str]) -> list[tuple[str, int]]:
    """``(path, label)`` of every image under ``root/<class>/``, sorted; empty classes are errors.

    ``DirEntry.is_file`` answers from the directory listing for plain files (no ``stat`` per
    image, which matters for a million-image tree on a network file system).
    """
    items = []
    for label, cls in enumerate(classes):
        folder = os.path.join(root, cls)
        if not os.path.isdir(folder):
            continue                                   # a class absent from val/test is allowed
        with os.scandir(folder) as it:
            entries = sorted((e for e in it if e.name.lower().endswith(EXTENSIONS)), key=lambda e: e.name)
        if not entries:
            raise SourceError(f"{folder}: empty class folder (no {'/'.join(EXTENSIONS)} images)")
        for e in entries:
            if not e.is_file():
                refuse_irregular(e.path)
        items += [(e.path, label) for e in entries]
    return items


def _open(path: str, draft: tuple | None = None):
    """Open and fully decode (so a truncated file fails here); ``draft`` (w, h) lets libjpeg downscale."""
    Image = images.pil()
    refuse_irregular(path)                       # it may have been replaced since the listing
    try:
        img = Image.open(path)
        if draft:
            img.draft("RGB", draft)
        img.load()
        return img
    except Exception as exc:  # Pillow raises many types for bad files: one line naming the file
        raise SourceError(f"{path}: unreadable image ({type(exc).__name__}: {exc})") from None


JPEG_QUALITY = 95            # re-encoded images (not JPEG, CMYK, or over --max-side)


def whole_jpeg(path: str, max_side: int | None) -> bytes:
    """The bytes to store for the whole image at ``path`` (module docstring)."""
    Image = images.pil()
    with Image.open(path) as img:
        big = max_side is not None and max(img.size) > max_side
        if img.format == "JPEG" and img.mode in ("RGB", "L") and not big:
            with open(path, "rb") as fh:
                return fh.read()
        if big:
            w, h = img.size
            f = max_side / max(w, h)
            size = (max(1, round(w * f)), max(1, round(h * f)))
            img.draft("RGB", size)
            out = img.convert("RGB").resize(size, Image.Resampling.LANCZOS)
        else:
            out = img.convert("RGB")
        return images.encode_jpeg(images.to_chw(out, 3), JPEG_QUALITY)


def _split_reader(items: list, shape: tuple, encode: str, fixed_size: bool, max_side: int | None = None):
    c, h, w = shape

    def read(lo: int, hi: int) -> Chunk:
        xs, px = [], np.empty((hi - lo, c, h, w), np.uint8)
        for k, (path, _) in enumerate(items[lo:hi]):
            img = _open(path, (w, h) if fixed_size else None)
            if not fixed_size and (img.height, img.width) != (h, w):
                raise SourceError(f"{path}: image is {img.height}x{img.width}, the first one is {h}x{w}; "
                                  f"pass --size H W to resize")
            px[k] = images.to_chw(images.fit(img, h, w), c)
            img.close()
            if encode == "jpeg":
                try:
                    xs.append(whole_jpeg(path, max_side))
                except OSError as exc:
                    raise SourceError(f"{path}: unreadable image ({type(exc).__name__}: {exc})") from None
        y = np.array([label for _, label in items[lo:hi]], np.int64)
        return Chunk(xs if encode == "jpeg" else px, y, px)
    return read


@source("imagefolder")
def load_imagefolder(src: str | None, *, test_fraction: float = 0.2, seed: int = 0, size=None,
                     encode="raw", class_names=None, max_side: int | None = None, **_) -> Source:
    """A class-per-folder image tree, as (3, H, W) uint8 (raw) or kept JPEG bytes."""
    if not src or not os.path.isdir(src):
        raise SourceError(f"{src}: image folder not found")
    held_out = next((d for d in ("val", "test") if os.path.isdir(os.path.join(src, d))), None)
    train_root = os.path.join(src, "train") if held_out and os.path.isdir(os.path.join(src, "train")) else src
    classes = list_classes(train_root)
    if not classes:
        raise SourceError(f"{train_root}: no class sub-folders")
    rng = np.random.default_rng(seed)
    items = list_files(train_root, classes)
    if train_root != src:
        assert held_out is not None         # train_root is src/train only with one
        test_root = os.path.join(src, held_out)
        extra = set(list_classes(test_root)) - set(classes)
        if extra:
            raise SourceError(f"{test_root}: classes {sorted(extra)} are not in {train_root}")
        splits = {"train": items, "test": list_files(test_root, classes)}
    else:
        n_test = held_out_count(len(items), test_fraction, train_root)
        perm = rng.permutation(len(items))
        splits = {"train": [items[i] for i in sorted(perm[n_test:])], "test": [items[i] for i in sorted(perm[:n_test])]}
    splits = {k: [v[i] for i in rng.permutation(len(v))] for k, v in splits.items()}
    if size:
        h, w = size
    else:
        first = _open(splits["train"][0][0])
        h, w = first.height, first.width
        first.close()
    shape = (3, h, w)
    index_extra = {"jpeg": {"stored": "whole", "max_side": max_side}} if encode == "jpeg" else {}
    return Source({k: SplitSource(len(v), _split_reader(v, shape, encode, bool(size), max_side))
                   for k, v in splits.items()}, class_names or classes, shape, "uint8", encode, src, extra=index_extra)
