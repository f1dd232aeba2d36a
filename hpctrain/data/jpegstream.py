"""A rank's JPEG batches, decoded on its worker pool: what :class:`ShardLoader` (and the node
reader, for each rank of its node) hands on instead of encoded bytes.

Shards that store whole images (index ``jpeg.stored == "whole"``, ``data_tools convert --encode
jpeg``) are cut at decode time: training batches with the random-resized crop and flip of
:mod:`crops` when the loader's augmentation is ``rrc`` (the augmentation is then done: nothing is
resampled twice), everything else with the evaluation centre crop. Shards fitted to
``sample_shape`` (written before) decode as before (:func:`images.decode`), on the same pool.

The next batch is submitted before the current one is awaited (``LOOKAHEAD``), so the workers do
not idle between batches. A file that does not decode is one :class:`ShardError` naming its shard
and sample (status 2).
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from hpctrain.data import gpudecode, images
from hpctrain.data.decodepool import UNDECODABLE, CropDecoder, DecodePool, SampleError
from hpctrain.data.index import ShardError

LOOKAHEAD = 1           # batches in flight beyond the one being awaited


def sample_name(shards, g: int) -> str:
    """``path: sample k (global g)`` of global sample ``g`` of a :class:`ShardSet`."""
    i = int(np.searchsorted(shards.starts, g, side="right")) - 1
    return f"{shards.path(i)}: sample {g - int(shards.starts[i])} (global {g})"


class FittedDecoder(CropDecoder):
    """Shards fitted to ``sample_shape`` (index ``jpeg.stored == "fitted"``): every sample decodes
    to its cover-resized centre crop (:func:`images.decode`, Pillow), no box to draw."""

    def plan(self, blobs, train, seed=0, epoch=0, first_position=0):
        return [None] * len(blobs), [None] * len(blobs)     # nothing to draw: the fitted centre

    def _decode_one(self, blob, box, size, out) -> None:
        out[...] = images.decode(blob, self.shape)


class JpegBatches:
    """Decodes a loader's window batches (``loader.window_batches``) on a :class:`DecodePool`."""

    def __init__(self, loader, workers: int = 1, backend: str = "auto", decode: str = "cpu", device=None):
        self.loader = loader
        idx = loader.shards.index
        self.shape = tuple(idx.sample_shape)
        self.whole = idx.stored == "whole"
        self.pool = DecodePool(workers)
        t = loader.transform
        self.train_crops = bool(self.whole and t is not None and hasattr(t, "resolve")
                                and t.resolve(self.shape[-2]) == "rrc")
        kw = dict(scale=t.scale, ratio=t.ratio, flip=t.flip) if self.train_crops else {}
        self.decoder = (CropDecoder(self.shape, self.pool, backend, **kw) if self.whole
                        else FittedDecoder(self.shape, self.pool, "pil"))
        self.on_device = None            # a DeviceCropDecoder when batches are decoded on the GPU
        if gpudecode.resolve(decode, raw=loader.raw, whole=self.whole, node=loader.reading.node_level,
                             device=device) == "gpu":
            import torch
            dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
            self.on_device = gpudecode.DeviceCropDecoder(self.decoder, dev)

    @property
    def workers(self) -> int:
        return self.pool.workers

    def describe(self) -> str:
        what = ("whole images, random-resized crops cut at decode" if self.train_crops else
                "whole images, centre crops cut at decode" if self.whole else "images fitted to the sample shape")
        if self.on_device is not None:
            return f"JPEG {what}, decoded on {self.on_device.device} (nvJPEG)"
        return f"JPEG {what}, {self.decoder.backend} on {self.workers} decode worker(s)"

    def submit(self, xw, idx, ids, epoch: int, rank: int, step: int, augment: bool, out=None, normalize=None):
        """Start decoding the batch ``xw[idx]`` (step ``step`` of ``rank``; global sample ids ``ids``);
        ``normalize``: the workers normalise too (float32 batches)."""
        train = augment and self.train_crops
        try:
            p = self.decoder.submit(xw[idx], train, seed=self.loader.seed, epoch=epoch,
                                    first_position=self.loader.position(step, rank), out=out, normalize=normalize)
        except SampleError as exc:
            raise self._error(exc, ids) from None
        return p, ids

    def finish(self, pending) -> np.ndarray:
        p, ids = pending
        try:
            return p.result()
        except SampleError as exc:
            raise self._error(exc, ids) from None

    def _error(self, exc: SampleError, ids) -> ShardError:
        return ShardError(f"{sample_name(self.loader.shards, int(ids[exc.k]))}: JPEG does not decode ({exc})")

    def batches(self, epoch: int, skip: int, rank: int, augment: bool, normalize=None):
        """``rank``'s decoded batches ``(x, y)`` of ``epoch`` from step ``skip`` on (``normalize``:
        float32 tensors normalised by the workers)."""
        if self.on_device is not None:
            yield from self._device_batches(epoch, skip, rank, augment)
            return
        stats, pending = self.loader.stats, deque[tuple]()
        for step, (xw, yw, idx) in enumerate(self.loader.window_batches(epoch, skip, rank), start=skip):
            ids = self.loader.window_ids(rank)[idx]
            t0 = time.perf_counter()
            pending.append((self.submit(xw, idx, ids, epoch, rank, step, augment, normalize=normalize), yw[idx]))
            if len(pending) > LOOKAHEAD:
                p, y = pending.popleft()
                x = self.finish(p)
                stats.decode_s += time.perf_counter() - t0
                yield x, y
            else:
                stats.decode_s += time.perf_counter() - t0
        while pending:
            t0 = time.perf_counter()
            p, y = pending.popleft()
            x = self.finish(p)
            stats.decode_s += time.perf_counter() - t0
            yield x, y

    def _device_batches(self, epoch: int, skip: int, rank: int, augment: bool):
        """Raw uint8 batches decoded and cut on the device, with the boxes the CPU path draws."""
        assert self.on_device is not None
        train = augment and self.train_crops
        for step, (xw, yw, idx) in enumerate(self.loader.window_batches(epoch, skip, rank), start=skip):
            t0 = time.perf_counter()
            try:
                x = self.on_device.decode(xw[idx], train, seed=self.loader.seed, epoch=epoch,
                                          first_position=self.loader.position(step, rank))
            except SampleError as exc:
                raise self._error(exc, self.loader.window_ids(rank)[idx]) from None
            self.loader.stats.decode_s += time.perf_counter() - t0
            yield x, yw[idx]

    def close(self) -> None:
        self.pool.close()


__all__ = ["JpegBatches", "FittedDecoder", "UNDECODABLE", "sample_name"]
