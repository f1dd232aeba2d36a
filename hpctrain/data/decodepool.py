"""A rank's pool of JPEG decode workers, and the batch decode that runs on it.

Threads, not processes: simplejpeg (libjpeg-turbo) and Pillow release the GIL while they decode
and resize (measured: ``python -m hpctrain bench input``, docs/data.md), so threads decode in
parallel without pickling a batch across processes. Threads cannot be killed; a worker that
raises ends the job with one line (:class:`DecodeWorkerError`), never a hang.

The pool size (``data.workers``; 0 = :func:`default_workers`) comes from the cores this rank may
use: its CPU affinity (``os.sched_getaffinity``), shared with every rank of its node whose
affinity overlaps it (the masks are allgathered over the node: ``factory.train_loader``). A rank
bound to its own cores keeps all of them; ranks bound to one socket or NUMA domain, or sharing one
cpuset, or unbound, divide their cores by how many of them there are. The node reader
(``data.reader = node``) decodes for the whole node, so it keeps all its cores.

Each sample's crop is a pure function of ``(seed, epoch, global position)`` (:mod:`crops`) and each
worker writes only its own samples' rows of the output, so a batch is bit-identical for any number
of workers.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from hpctrain.data import crops, decoders
from hpctrain.errors import LocalUserError

MAX_WORKERS = 64
try:
    from PIL.Image import DecompressionBombError
except ImportError:                      # Pillow missing: simplejpeg decodes, nothing raises this
    class DecompressionBombError(Exception):  # type: ignore[no-redef]
        pass
# What the backends raise on a bad file: a corrupt body, Pillow's refusal of a decompression bomb,
# or a header claiming an image too large to allocate. The data's fault (status 2), not a bug.
UNDECODABLE = (ValueError, OSError, SyntaxError, EOFError, DecompressionBombError, MemoryError)


class DecodeWorkerError(LocalUserError):
    """A decode worker failed on something other than a bad file (a bug): one line, the job ends."""


class SampleError(Exception):
    """Sample ``k`` of a batch did not decode; the loader names its shard and sample."""

    def __init__(self, k: int, exc: BaseException):
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.k, self.exc = k, exc


def affinity() -> set[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def default_workers(mine: set[int] | None = None, node_masks: list | None = None, node_reader: bool = False) -> int:
    """Decode workers for one rank (module docstring): its cores ``mine`` divided by the number
    of the node's ranks whose mask (``node_masks``, this rank's included) intersects it; the node
    reader divides by 1. At least 1, at most :data:`MAX_WORKERS`."""
    mine = set(affinity() if mine is None else mine)
    sharers = 1 if node_reader or not node_masks else sum(1 for m in node_masks if mine & set(m))
    return max(1, min(MAX_WORKERS, len(mine) // max(sharers, 1)))


def resolve_workers(workers: int, mine: set[int] | None = None, node_masks: list | None = None,
                    node_reader: bool = False) -> int:
    if workers < 0:
        raise ValueError(f"data.workers {workers}: must be 0 (auto) or a positive count")
    return default_workers(mine, node_masks, node_reader) if workers == 0 else min(workers, MAX_WORKERS)


class DecodePool:
    """``workers`` threads (one: decode inline in the caller's thread, no pool)."""

    def __init__(self, workers: int):
        self.workers = max(1, int(workers))
        self._ex = (ThreadPoolExecutor(self.workers, thread_name_prefix="hpctrain-decode")
                    if self.workers > 1 else None)

    def submit(self, fn, *args) -> Future:
        if self._ex is not None:
            return self._ex.submit(fn, *args)
        f: Future = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as exc:  # handed to the caller through the future, as from a thread
            f.set_exception(exc)
        return f

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=True)
            self._ex = None


class PendingBatch:
    """A batch whose rows the pool is decoding; :meth:`result` waits and returns it."""

    def __init__(self, out, futures: list, starts: list):
        self.out, self.futures, self.starts = out, futures, starts

    def result(self):
        """The batch: a uint8 array, or a float32 tensor when the workers normalised it."""
        for f in self.futures:           # in sample order: the first bad sample is the one reported
            f.result()
        return self.out


class CropDecoder:
    """Decodes batches of whole stored JPEGs to ``shape`` = (C, H, W), cutting each sample's box.

    ``train`` batches: the random-resized crop of :func:`crops.rrc_box` (``scale``, ``ratio``,
    ``flip``); otherwise the evaluation centre crop. ``backend``: :data:`decoders.BACKENDS`.
    """

    def __init__(self, shape: tuple, pool: DecodePool, backend: str = "auto", scale=(0.08, 1.0),
                 ratio=(3 / 4, 4 / 3), flip: bool = True):
        self.shape, self.pool = tuple(shape), pool
        self.backend = decoders.resolve(backend)
        self.scale, self.ratio, self.flip = scale, ratio, flip

    def plan(self, blobs, train: bool, seed: int = 0, epoch: int = 0,
             first_position: int = 0) -> tuple[list, list]:
        """``(sizes, boxes)`` of a batch: what every decode path cuts (the seam the device path shares)."""
        sizes = []
        for k, b in enumerate(blobs):
            try:
                sizes.append(decoders.image_size(b, self.backend))
            except UNDECODABLE as exc:
                raise SampleError(k, exc) from None
        _, h, w = self.shape
        boxes = (crops.train_crops(sizes, seed, epoch, first_position, self.scale, self.ratio, self.flip)
                 if train else crops.eval_crops(sizes, h, w))
        return sizes, boxes

    def submit(self, blobs, train: bool, seed: int = 0, epoch: int = 0,
               first_position: int = 0, out: np.ndarray | None = None, normalize=None) -> PendingBatch:
        """Start decoding ``blobs`` (sample ``k`` at ``first_position + k``) into ``out`` (or a new
        uint8 array). With ``normalize`` (an :class:`~hpctrain.data.augment.Normalize`) each worker
        also normalises its rows into a new float32 tensor: the same float32 operations per element
        as normalising the whole batch (so the same bits), with the conversion's cost (most of it
        first-touching a fresh buffer) spread over the workers instead of left to the loader thread."""
        n = len(blobs)
        sizes, boxes = self.plan(blobs, train, seed, epoch, first_position)
        result: np.ndarray | torch.Tensor
        if normalize is not None:
            result = torch.empty((n, *self.shape), dtype=torch.float32)
            c = self.shape[0]
            stats = (normalize.mean.view(c, 1, 1), normalize.std.view(c, 1, 1))
        else:
            result = np.empty((n, *self.shape), np.uint8) if out is None else out
            stats = None
        chunks = max(1, min(n, 2 * self.pool.workers))
        starts = [n * i // chunks for i in range(chunks + 1)]
        futures = [self.pool.submit(self._rows, blobs, sizes, boxes, result, starts[i], starts[i + 1], stats)
                   for i in range(chunks)]
        return PendingBatch(result, futures, starts)

    def decode(self, blobs, train: bool, **kw) -> np.ndarray:
        return self.submit(blobs, train, **kw).result()

    def _decode_one(self, blob, box, size, out) -> None:
        c, h, w = self.shape
        decoders.decode_crop(blob, box, size, h, w, c, out, self.backend)

    def _rows(self, blobs, sizes, boxes, out, lo: int, hi: int, stats=None) -> None:
        scratch = np.empty(self.shape, np.uint8) if stats is not None else None
        for k in range(lo, hi):
            try:
                if scratch is None:
                    self._decode_one(blobs[k], boxes[k], sizes[k], out[k])
                else:
                    self._decode_one(blobs[k], boxes[k], sizes[k], scratch)
                    out[k].copy_(torch.from_numpy(scratch)).sub_(stats[0]).div_(stats[1])
            except UNDECODABLE as exc:
                raise SampleError(k, exc) from None
            except Exception as exc:
                raise DecodeWorkerError(f"decode worker {threading.current_thread().name} failed on batch "
                                        f"sample {k}: {type(exc).__name__}: {exc} (a bug, not your data: "
                                        f"please report it)") from exc
