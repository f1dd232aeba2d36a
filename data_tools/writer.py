"""Convert a :class:`Source` into hpctrain shards, in parallel over MPI ranks, resumably.

Every split is cut into ``n_shards`` balanced contiguous shards; shard jobs are dealt round-robin
to the ranks of ``comm`` (``mpiexec -n P python -m hpctrain.data_tools convert …``; one rank without MPI).
Each rank reads only its own samples, writes its own shard files (temporary name, then rename),
and records each finished shard in ``DIR/.convert/<shard>.json``: the source fingerprint, the
index entry (with SHA-256) and the per-channel sums for the normalisation statistics. Rank 0
gathers the records and writes ``index.json`` last, atomically; the old index is removed first,
so a directory with an index is complete, and a failed or killed conversion leaves none.
Re-running the same conversion skips every shard whose record matches and whose file still
hashes to the recorded SHA-256 (``resume``). A sample over ``sources.MAX_SAMPLE_BYTES`` is refused
before anything is written or allocated.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import cast

import numpy as np

from hpctrain.data.index import BLOCK_BYTES, BLOCK_DIGEST, INDEX, file_sha256, shard_name, write_index
from hpctrain.data.plan import shard_range
from hpctrain.data.shardwriter import ShardWriter, shard_digests, shard_grid
from hpctrain.errors import UserError
from hpctrain.ops.fileio import atomic_write_text

from .sources import Source, SourceError, check_sample_bytes, from_arrays

CHUNK_BYTES = 32 << 20          # samples read and written per step (bounds memory per rank)
RECORDS = ".convert"


class ConvertError(UserError):
    """A conversion failed on some rank (message names the file, and the sample where known)."""


class Moments:
    """Per-channel count, sum and sum of squares in float64; merged exactly across shards."""

    def __init__(self, c: int, count=0, s=None, ss=None):
        self.c, self.count = c, int(count)
        self.s = np.zeros(c) if s is None else np.asarray(s, np.float64)
        self.ss = np.zeros(c) if ss is None else np.asarray(ss, np.float64)

    def add(self, px: np.ndarray) -> None:
        q = px.reshape(len(px), self.c, -1)
        for ch in range(self.c):
            v = q[:, ch].astype(np.float64)
            self.s[ch] += v.sum()
            self.ss[ch] += np.dot(v.ravel(), v.ravel())
        self.count += q.shape[0] * q.shape[2]

    def merge(self, other: Moments) -> None:
        self.count += other.count
        self.s += other.s
        self.ss += other.ss

    def normalize(self) -> dict:
        """``{"mean", "std"}`` (population std, as ``np.std``); a constant channel gets std 1."""
        n = max(self.count, 1)
        mean = self.s / n
        std = np.sqrt(np.maximum(self.ss / n - mean ** 2, 0.0))
        return {"mean": mean.tolist(), "std": np.where(std > 0, std, 1.0).tolist()}

    def to_json(self) -> dict:
        return {"count": self.count, "sum": self.s.tolist(), "sumsq": self.ss.tolist()}


def shard_jobs(source: Source, n_shards: int) -> list[tuple[str, int, int, int, int]]:
    """``(split, i, n, lo, hi)`` for every shard of every split, in index order (:func:`shard_range`)."""
    jobs = []
    for split, sp in source.splits.items():
        n = min(n_shards, max(sp.num_samples, 1))
        jobs += [(split, i, n, *shard_range(sp.num_samples, n, i)) for i in range(n)]
    return jobs


def _fingerprint(source: Source, job: tuple, tag: str) -> str:
    desc = json.dumps([tag, list(source.sample_shape), source.dtype, source.encoding, source.class_names, job,
                       *([source.extra] if source.extra else [])])
    return hashlib.sha256(desc.encode()).hexdigest()


def _load_record(out: str, name: str, fingerprint: str, block_bytes: int, digest: str) -> dict | None:
    """The record of a finished shard that still matches, its block digests redone when they are not
    of kind ``digest`` on the grid ``block_bytes`` gives (converted before index v3/v4/v5, or with
    other options)."""
    path = os.path.join(out, RECORDS, name + ".json")
    try:
        with open(path) as fh:
            rec = json.load(fh)
    except (OSError, ValueError):
        return None
    shard = os.path.join(out, name)
    if rec.get("fingerprint") != fingerprint or not os.path.exists(shard):
        return None
    blocks, (grid, _) = rec["entry"].get("blocks") or {}, shard_grid(shard, block_bytes, digest)
    if (blocks.get("bytes"), blocks.get("origin", 0)) == (grid.block_bytes, grid.origin) and digest in blocks:
        return rec if file_sha256(shard) == rec["entry"]["sha256"] else None
    digests = shard_digests(shard, block_bytes, digest)
    if digests["sha256"] != rec["entry"]["sha256"]:
        return None
    rec["entry"].update(digests)
    atomic_write_text(path, json.dumps(rec))
    return rec


def _channels(source: Source) -> int:
    return source.sample_shape[0] if source.sample_shape else 1


def _convert_job(source: Source, out: str, job: tuple, fingerprint: str, bar, block_bytes: int,
                 digest: str) -> dict:
    split, i, n, lo, hi = job
    sp = source.splits[split]
    sample_bytes = max(int(np.prod(source.sample_shape)) * np.dtype(source.dtype).itemsize, 1)
    step = max(1, CHUNK_BYTES // sample_bytes)
    moments = Moments(_channels(source))
    w = ShardWriter(out, split, i, n, hi - lo, source.sample_shape, source.dtype, source.encoding, block_bytes,
                    digest)
    try:
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            chunk = sp.read(a, b)
            bad = np.flatnonzero((chunk.y < 0) | (chunk.y >= len(source.class_names)))
            if bad.size:
                raise SourceError(f"{source.origin}: split {split} sample {a + int(bad[0])} has label "
                                  f"{int(chunk.y[bad[0]])}, outside 0..{len(source.class_names) - 1}")
            raw = cast(np.ndarray, chunk.x)     # with encoding "raw" an array (jpeg: a list of bytes)
            if source.encoding == "raw" and (raw.shape[1:] != tuple(source.sample_shape)
                                             or str(raw.dtype) != source.dtype):
                raise SourceError(f"{source.origin}: split {split} samples {a}..{b} are {raw.dtype} "
                                  f"{raw.shape[1:]}, expected {source.dtype} {tuple(source.sample_shape)}")
            moments.add(chunk.pixels if chunk.pixels.ndim > 1 else chunk.pixels[:, None])
            w.write(chunk.x, chunk.y)
            if bar is not None:
                bar.update(b - a)
    except BaseException:
        w.abort()
        raise
    rec = {"fingerprint": fingerprint, "entry": w.finish(), "moments": moments.to_json()}
    atomic_write_text(os.path.join(out, RECORDS, shard_name(split, i, n) + ".json"), json.dumps(rec))
    return rec


def _index_meta(source: Source, jobs: list, records: list) -> dict:
    stats_split = "train" if "train" in source.splits else jobs[0][0]
    total = Moments(_channels(source))
    splits: dict[str, dict] = {}
    for job, rec in zip(jobs, records):
        split = job[0]
        sp = splits.setdefault(split, {"num_samples": source.splits[split].num_samples, "shards": []})
        sp["shards"].append(rec["entry"])
        if split == stats_split:
            m = rec["moments"]
            total.merge(Moments(total.c, m["count"], m["sum"], m["sumsq"]))
    return {"sample_shape": list(source.sample_shape), "dtype": source.dtype, "encoding": source.encoding,
            "num_classes": len(source.class_names), "class_names": list(source.class_names),
            "normalize": total.normalize(), "splits": splits, **source.extra}


def _prepare_out(out: str) -> str | None:
    """Rank 0 makes the output directory and drops an old index (an index claims completeness);
    the error line, or None."""
    try:
        os.makedirs(os.path.join(out, RECORDS), exist_ok=True)
        if os.path.exists(os.path.join(out, INDEX)):
            os.remove(os.path.join(out, INDEX))
    except OSError as exc:
        return f"{out}: cannot prepare the output directory ({exc})"
    return None


def _progress_bar(jobs: list, mine: list[int], size: int):
    from tqdm import tqdm
    return tqdm(total=sum(jobs[k][4] - jobs[k][3] for k in mine), unit="sample", dynamic_ncols=True,
                desc=f"convert{f' (rank 0 of {size})' if size > 1 else ''}")


def _write_shards(source: Source, out: str, jobs: list, mine: list[int], tag: str, resume: bool, bar,
                  block_bytes: int, block_digest: str) -> tuple[dict, int]:
    """This rank's shards ``mine`` written, or taken from a finished earlier run (``resume``):
    ``({job: record}, shards taken as they were)``."""
    records: dict[int, dict] = {}
    skipped = 0
    for k in mine:
        fp = _fingerprint(source, jobs[k], tag)
        rec = _load_record(out, shard_name(*jobs[k][:3]), fp, block_bytes, block_digest) if resume else None
        if rec is None:
            rec = _convert_job(source, out, jobs[k], fp, bar, block_bytes, block_digest)
        else:
            skipped += 1
            if bar is not None:
                bar.update(jobs[k][4] - jobs[k][3])
        records[k] = rec
    return records, skipped


def convert(source: Source, out: str, n_shards: int = 1, *, comm=None, tag: str = "",
            resume: bool = True, progress: bool = False, block_bytes: int = BLOCK_BYTES,
            block_digest: str = BLOCK_DIGEST) -> dict:
    """Write ``source`` as shards in ``out``; collective over ``comm``. Returns the index dict.

    ``tag`` identifies the source and options (it goes into the fingerprint that ``resume``
    compares). ``block_bytes``, ``block_digest``: the size and kind of the index's per-block digests
(``index.py``). Raises :class:`ConvertError` on every rank when any rank failed.
    """
    from mpi4py import MPI

    from hpctrain.ops.agree import agree
    comm = MPI.COMM_SELF if comm is None else comm
    rank, size = comm.Get_rank(), comm.Get_size()
    if n_shards < 1:
        raise ConvertError(f"--shards must be >= 1, got {n_shards}")
    try:                                     # the same answer on every rank: no agreement needed
        check_sample_bytes(source.sample_shape, source.dtype, source.origin)
    except SourceError as exc:
        raise ConvertError(str(exc)) from None
    agree(comm, _prepare_out(out) if rank == 0 else None, ConvertError)
    jobs = shard_jobs(source, n_shards)
    mine = [k for k in range(len(jobs)) if k % size == rank]
    bar = _progress_bar(jobs, mine, size) if progress and rank == 0 else None
    records: dict[int, dict] = {}
    error, skipped = None, 0
    try:
        records, skipped = _write_shards(source, out, jobs, mine, tag, resume, bar, block_bytes, block_digest)
    except (SourceError, OSError, ValueError) as exc:
        error = str(exc)
    finally:
        if bar is not None:
            bar.close()
    agree(comm, error, ConvertError)
    gathered = comm.gather((records, skipped), root=0)
    meta = None
    if rank == 0:
        allrec = {k: r for recs, _ in gathered for k, r in recs.items()}
        meta = _index_meta(source, jobs, [allrec[k] for k in range(len(jobs))])
        meta["skipped_shards"] = sum(s for _, s in gathered)
        write_index(out, {k: v for k, v in meta.items() if k != "skipped_shards"})
    return comm.bcast(meta, root=0)


def write_dataset(out: str, splits: dict, class_names: list, n_shards: int = 1) -> dict:
    """Write in-memory ``{split: (x, y)}`` arrays as shards (serial); returns the index dict."""
    return convert(from_arrays(splits, class_names, out), out, n_shards, resume=False)
