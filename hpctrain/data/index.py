"""The HDF5 shard format (version 5; versions 1 to 4 are read too) and its index: names, fields, checks.

A dataset is a directory::

    index.json                     written last, atomically; its presence means "complete"
    train-00000-of-00004.h5 …      one file per shard and split

``index.json`` holds ``format`` ("hpctrain-shards"), ``version`` (5), ``sample_shape``, ``dtype``,
``num_classes``, ``class_names``, ``normalize`` ({"mean": [...], "std": [...]} per channel, in raw
units, from the train split) and ``splits``: ``{"train": {"num_samples": N, "shards": [{"file",
"num_samples", "sha256"}, …]}, …}``. Each shard file holds datasets ``x`` (N, *sample_shape) and
``y`` (N,) int64, with attributes ``format``, ``version``, ``split``, ``shard``. A ``file`` is a
relative path that stays inside the directory (lexically: not absolute, no ``..``); symlinks in
the directory are followed, as its owner may assemble a dataset from several file systems.

Version 2 adds ``encoding``: ``"raw"`` (the v1 layout; a v1 index means raw) or ``"jpeg"``, where
``x`` is (N,) variable-length uint8 (h5py ``vlen_dtype``), one encoded image per sample, and
``sample_shape``/``dtype`` describe the *decoded* sample the loader produces (``images.py``).
An optional ``jpeg`` object (any version) says how JPEG samples were stored: ``{"stored": "whole",
"max_side": N or null}`` — each whole image (the source file's own bytes where it was a JPEG no
longer than ``max_side``), so the loader cuts its crops at decode time (``crops.py``); absent or
``"fitted"``: every image was fitted to ``sample_shape`` (what hpctrain wrote before, read as before).
Version 3 adds to each shard entry ``blocks``: ``{"bytes": B, "file_bytes": S, "sha256": [...],
"data": [[a, b], ...]}``, the SHA-256 of every ``B``-byte range of the ``S``-byte file (block k is
bytes ``k*B .. min((k+1)*B, S)``) and the block ranges ``[a, b)`` that lie wholly inside the
contiguous storage of ``x`` or ``y``: those are checked as the reader first reads them, all other
blocks (HDF5 metadata, free space) when the file is opened (``shard_checks.py``). ``blocks`` is optional
(an entry without it is checked whole, as in v2). Version 4 lets ``blocks`` name its digest: one
key of :data:`BLOCK_DIGESTS` (:mod:`digestblocks`) holds the list, ``"xxh3_128"`` (32 hex digits, what the writer makes
by default) or ``"sha256"``. Why XXH3-128 for blocks: it finds the corruption a block check is for
(flipped bits, torn writes, truncation, another file) as surely, at several times the speed of a
memory copy where SHA-256 runs below it, so the first epoch's check costs a fraction of the read
instead of most of it (``bench io``; docs/data.md); it is no defence against someone forging
data, which the whole file's SHA-256 in the same entry (``data_tools verify``) still is.
Version 5 adds ``origin`` (bytes, ``-B < origin <= 0``; absent: 0, as in v3/v4): block k is bytes
``max(0, origin + k*B) .. min(origin + (k+1)*B, S)`` (:class:`BlockGrid`). The writer lays the grid
on the sample rows of a raw ``x``: ``B`` is the power-of-two number of rows nearest 1 MiB (or
``--block-kib``), and the grid passes through the byte where ``x`` starts. With shards cut at
multiples of 32 samples (``plan.shard_range``), a run of the loader's plan (blocks of a
power-of-two number of samples) then begins and ends on block boundaries, or lies inside one
block, so the first epoch's check reads nothing beside the run (``blocks.py``). An index says
version 5 only when an entry has a non-zero ``origin``; JPEG data and SHA-256 blocks (the v3
layout, for readers before v4) keep 1 MiB blocks from byte 0.
Files are written by ``shardwriter.py``. Samples are addressed by a global index per split;
:meth:`hpctrain.data.shards.ShardSet.read_range` turns a contiguous index range into one slice
per shard touched — never per-sample reads.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from hpctrain.data.digestblocks import (
    BLOCK_BYTES,
    BLOCK_DIGEST,
    BLOCK_DIGESTS,
    DIGEST_LABELS,
    ONE_SHOT,
    BlockGrid,
    aligned_grid,
    block_digest_name,
    block_hasher,
    data_block_ranges,
    file_digests,
    file_sha256,
)
from hpctrain.data.indexfields import field_problems
from hpctrain.errors import LocalUserError
from hpctrain.ops.fileio import atomic_write_text

FORMAT = "hpctrain-shards"
VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
ENCODINGS = ("raw", "jpeg")
JPEG_STORED = ("fitted", "whole")
INDEX = "index.json"

__all__ = ["BLOCK_BYTES", "BLOCK_DIGEST", "BLOCK_DIGESTS", "DIGEST_LABELS", "ENCODINGS", "FORMAT", "INDEX",
           "JPEG_STORED", "ONE_SHOT", "READABLE_VERSIONS", "VERSION", "BlockGrid", "ShardError", "ShardIndex",
           "aligned_grid", "block_digest_name", "block_hasher", "data_block_ranges", "file_digests", "file_sha256",
           "read_index", "shard_name", "write_index"]


class ShardError(LocalUserError):
    """A shard directory or file is missing, truncated, changed or inconsistent (message names the file).

    Raised on every rank at once by the collective checksum pass; raised by one rank alone when
    its reads find it (a label out of range, a file cut short after the check, a set opened
    without a communicator).
    """


def shard_name(split: str, i: int, n: int) -> str:
    return f"{split}-{i:05d}-of-{n:05d}.h5"


def write_index(directory: str, meta: dict) -> None:
    """``meta`` as the index, its version the lowest that holds it: 3 unless a block digest needs 4
    or a grid origin needs 5, so data converted with ``--block-digest sha256``, or whose grid
    starts at byte 0, stays readable by hpctrain before v4 or v5."""
    blocks = [e.get("blocks", {}) for sp in meta.get("splits", {}).values() for e in sp["shards"]]
    version = (5 if any(b.get("origin") for b in blocks) else
               4 if any(k in b for b in blocks for k in BLOCK_DIGESTS if k != "sha256") else 3)
    meta = {"format": FORMAT, "version": version, **meta}
    atomic_write_text(os.path.join(directory, INDEX), json.dumps(meta, indent=1))


@dataclass(frozen=True)
class ShardIndex:
    directory: str
    sample_shape: tuple
    dtype: str
    num_classes: int
    class_names: list
    normalize: dict
    splits: dict
    encoding: str = "raw"
    stored: str = "fitted"      # jpeg: "fitted" (sample_shape, cover + centre crop) | "whole" (crops cut at decode)

    def num_samples(self, split: str) -> int:
        return int(self.split(split)["num_samples"])

    def split(self, split: str) -> dict:
        if split not in self.splits:
            raise ShardError(f"{os.path.join(self.directory, INDEX)}: no split {split!r} "
                             f"(has {', '.join(self.splits)})")
        return self.splits[split]


def read_index(directory: str) -> ShardIndex:
    """Load and check ``DIR/index.json``; every problem is one ShardError line naming the file."""
    path = os.path.join(directory, INDEX)
    if not os.path.isdir(directory):
        raise ShardError(f"{directory}: shard directory not found")
    if not os.path.exists(path):
        raise ShardError(f"{path}: missing (not a shard directory, or conversion did not finish)")
    try:
        with open(path) as fh:
            meta = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ShardError(f"{path}: unreadable index ({exc})") from None
    if meta.get("format") != FORMAT:
        raise ShardError(f"{path}: field 'format' is {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("version") not in READABLE_VERSIONS:
        raise ShardError(f"{path}: field 'version' is {meta.get('version')!r}, this hpctrain reads "
                         f"{', '.join(map(str, READABLE_VERSIONS))}")
    if meta.get("encoding", "raw") not in ENCODINGS:
        raise ShardError(f"{path}: field 'encoding' is {meta.get('encoding')!r}, expected one of {ENCODINGS}")
    for key in ("sample_shape", "dtype", "num_classes", "splits"):
        if key not in meta:
            raise ShardError(f"{path}: missing field {key!r}")
    if not isinstance(meta["splits"], dict):
        raise ShardError(f"{path}: field 'splits' is {type(meta['splits']).__name__}, expected an object")
    problem = field_problems(meta)               # dtype, shape, classes, normalisation: convert's limits
    if problem:
        raise ShardError(f"{path}: field {problem[0]!r} {problem[1]}")
    for name, sp in meta["splits"].items():
        _check_split(path, name, sp)
    return ShardIndex(directory=directory, sample_shape=tuple(meta["sample_shape"]), dtype=meta["dtype"],
                      num_classes=int(meta["num_classes"]), class_names=list(meta.get("class_names", [])),
                      normalize=meta.get("normalize", {}), splits=meta["splits"],
                      encoding=meta.get("encoding", "raw"), stored=_jpeg_stored(path, meta))


def _jpeg_stored(path: str, meta: dict) -> str:
    """``jpeg.stored`` (absent: ``fitted``, what every index before it means)."""
    stored = (meta.get("jpeg") or {}).get("stored", "fitted") if isinstance(meta.get("jpeg", {}), dict) else None
    if stored not in JPEG_STORED:
        raise ShardError(f"{path}: field 'jpeg.stored' is {stored!r}, expected one of {JPEG_STORED}")
    return stored


def _check_split(path: str, name: str, sp) -> None:
    """One split of the index: counts add up, every entry complete, every ``file`` inside the directory."""
    where = f"{path}: split {name!r}"
    if not isinstance(sp, dict):
        raise ShardError(f"{where}: expected an object with 'num_samples' and 'shards'")
    for key, ok, what in (("num_samples", _is_count, "a count"), ("shards", lambda v: isinstance(v, list), "a list")):
        if key not in sp:
            raise ShardError(f"{where}: missing field {key!r}")
        if not ok(sp[key]):
            raise ShardError(f"{where}: field {key!r} is {sp[key]!r:.40}, expected {what}")
    for k, e in enumerate(sp["shards"]):
        field = f"{where} shard {k}"
        if not isinstance(e, dict):
            raise ShardError(f"{field}: expected an object with 'file', 'num_samples', 'sha256'")
        for key in ("file", "num_samples", "sha256"):
            if key not in e:
                raise ShardError(f"{field}: missing field {key!r}")
        f = e["file"]
        parts = f.replace("\\", "/").split("/") if isinstance(f, str) else []
        if not f or not isinstance(f, str) or os.path.isabs(f) or ".." in parts or "\0" in f or f.strip("./") == "":
            raise ShardError(f"{field}: field 'file' is {f!r}: must be a relative path inside the shard "
                             f"directory (not absolute, no '..')")
        if not _is_count(e["num_samples"]):
            raise ShardError(f"{field}: field 'num_samples' is {e['num_samples']!r}, expected a count")
        if not _is_sha256(e["sha256"]):
            raise ShardError(f"{field}: field 'sha256' is {e['sha256']!r}, expected 64 hex digits")
        if "blocks" in e:
            _check_blocks(f"{field} field 'blocks'", e["blocks"])
    counted = sum(e["num_samples"] for e in sp["shards"])
    if counted != sp["num_samples"]:
        raise ShardError(f"{where} says {sp['num_samples']} samples, shards hold {counted}")


def _check_blocks(where: str, bl) -> None:
    """A ``blocks`` object: sizes, one digest per block of the file (one named kind), data ranges in order."""
    names = [k for k in BLOCK_DIGESTS if isinstance(bl, dict) and k in bl]
    if not isinstance(bl, dict) or not all(k in bl for k in ("bytes", "file_bytes", "data")) or len(names) != 1:
        raise ShardError(f"{where}: expected an object with 'bytes', 'file_bytes', 'data' and one digest list "
                         f"({' or '.join(map(repr, BLOCK_DIGESTS))})")
    if not (_is_count(bl["bytes"]) and bl["bytes"] > 0 and _is_count(bl["file_bytes"])):
        raise ShardError(f"{where}: 'bytes' {bl['bytes']!r:.20} / 'file_bytes' {bl['file_bytes']!r:.20} "
                         f"must be counts, 'bytes' > 0")
    origin = bl.get("origin", 0)
    if not (isinstance(origin, int) and not isinstance(origin, bool) and -bl["bytes"] < origin <= 0):
        raise ShardError(f"{where}: 'origin' is {origin!r:.20}, expected an integer in {1 - bl['bytes']}..0")
    n, name = BlockGrid(bl["bytes"], bl["file_bytes"], origin).count, names[0]
    digits = BLOCK_DIGESTS[name]
    if not isinstance(bl[name], list) or len(bl[name]) != n or not all(_is_hex(v, digits) for v in bl[name]):
        raise ShardError(f"{where}: {name!r} must list {n} digests of {digits} hex digits (one per block)")
    last = 0
    for r in bl["data"] if isinstance(bl["data"], list) else [None]:
        if not (isinstance(r, list) and len(r) == 2 and all(map(_is_count, r)) and last <= r[0] < r[1] <= n):
            raise ShardError(f"{where}: 'data' must hold ascending block ranges [a, b) within 0..{n}, got {r!r:.40}")
        last = r[1]


def _is_hex(v, digits: int) -> bool:
    return isinstance(v, str) and len(v) == digits and all(c in "0123456789abcdefABCDEF" for c in v)


def _is_sha256(v) -> bool:
    return _is_hex(v, 64)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
