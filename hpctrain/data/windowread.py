"""A rank's batches read from the shards: contiguous runs into a reused window, shuffled there.

The epoch's permuted sequence is dealt to the loader's ``lanes`` lanes, each a balanced
contiguous share, computed lazily a chunk at a time (:func:`plan.iter_rank_runs`); a lane reads its
runs as long slices (``read_direct``) into a window buffer of ``shuffle_window`` samples, shuffles
within it (generator seeded by ``(seed, epoch, lane)``) and gives ``global_batch / lanes`` samples
to each global batch. Rank ``r`` of ``n`` holds lanes ``r·L/n .. (r+1)·L/n``, its lanes' shares
side by side, so with ``lanes`` fixed global batch ``k`` is the same at any rank count that
divides ``lanes`` (docs/data.md).
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from hpctrain.data import plan


class WindowReader:
    """The window reads of one :class:`~hpctrain.data.loader.ShardLoader` (its shards, seed, plan
    sizes and stats, read from the loader, so the two never disagree)."""

    def __init__(self, loader):
        self.loader = loader
        self._bufs: dict = {}
        self._ids: dict = {}                       # rank -> global sample ids of its window buffer

    def runs(self, epoch: int, lane: int) -> Iterator[tuple[int, int]]:
        """``lane``'s runs this epoch, computed lazily (:func:`plan.iter_rank_runs`)."""
        ld = self.loader
        total = None if ld.drop_last else ld.steps * ld.global_batch
        return plan.iter_rank_runs(ld.shards.num_samples, ld.lanes, lane,
                                   epoch=epoch, seed=ld.seed, block_size=ld.block_size, total=total)

    def rank_lanes(self, rank: int) -> range:
        """The lanes rank ``rank`` reads: its contiguous ``lanes / size`` of them."""
        per = self.loader.lanes // self.loader.size
        return range(rank * per, (rank + 1) * per)

    def _buffers(self, key, capacity: int):
        """Window buffers by ``key``, kept across epochs (fresh pages cost more than the copy)."""
        index = self.loader.shards.index
        key = (key, capacity)
        if key not in self._bufs:
            x = (np.empty(capacity, object) if index.encoding == "jpeg"
                 else np.empty((capacity, *index.sample_shape), index.dtype))
            self._bufs[key] = (x, np.empty(capacity, np.int64), np.empty(capacity, np.int64))
        return self._bufs[key]

    def window_ids(self, rank: int) -> np.ndarray:
        """The global sample ids of ``rank``'s window buffer, as :meth:`window_batches` last filled it."""
        return self._ids[rank]

    def window_batches(self, epoch: int, skip: int, rank: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``rank``'s batches as ``(x_window, y_window, indices)``: valid until the next item.

        Each lane's share is a random subset of its window. One lane per rank: the batch is
        gathered from the window by the caller (the only copy after the read); several: their
        shares are first copied side by side into a batch buffer.
        """
        ld = self.loader
        lanes = self.rank_lanes(rank)
        b = ld.batch_size // len(lanes)
        gens = [self._lane_batches(epoch, lane, b) for lane in lanes]
        if len(gens) == 1:
            for emitted, (xw, yw, iw, idx) in enumerate(gens[0]):
                if emitted >= ld.steps:
                    return
                self._ids[rank] = iw
                if emitted >= skip:
                    yield xw, yw, idx
            return
        xb, yb, ib = self._buffers(("batch", rank), ld.batch_size)
        self._ids[rank] = ib
        whole = np.arange(ld.batch_size)
        for emitted, shares in enumerate(zip(*gens)):
            if emitted >= ld.steps:
                return
            if emitted < skip:
                continue
            for j, (xw, yw, iw, idx) in enumerate(shares):
                xb[j * b:(j + 1) * b], yb[j * b:(j + 1) * b], ib[j * b:(j + 1) * b] = xw[idx], yw[idx], iw[idx]
            yield xb, yb, whole

    def _lane_batches(self, epoch: int, lane: int, b: int):
        """``lane``'s shares of the epoch's global batches, ``b`` samples each, as
        ``(x_window, y_window, ids_window, indices)``."""
        window = max(self.loader.shuffle_window, b)
        xw, yw, iw = self._buffers(("lane", lane), 2 * window)
        for order in self._windows(epoch, lane, xw, yw, window, iw, b):
            for k in range(0, len(order) // b * b, b):
                yield xw, yw, iw, order[k:k + b]

    def _windows(self, epoch: int, lane: int, xw: np.ndarray, yw: np.ndarray, window: int, iw: np.ndarray,
                 b: int):
        """Fill the window buffers run by run; yield the shuffled order of each full window (and
        of the last, partial one). When the caller asks for the next window, the samples left past
        the last whole share move to the front and the window fills up behind them."""
        ld = self.loader
        rng = np.random.default_rng([ld.seed, epoch, 1 + lane])  # per-lane offset: 1 + lane
        pos = 0
        for a, stop in self.runs(epoch, lane):
            for s in range(a, stop, window):
                e = min(stop, s + window)
                t0 = time.perf_counter()
                ld.shards.read_into(s, e, xw[pos:], yw[pos:])
                ld.stats.read_s += time.perf_counter() - t0
                iw[pos:pos + e - s] = np.arange(s, e)
                pos += e - s
                if pos < window:
                    continue
                order = rng.permutation(pos) if ld.shuffle_window else np.arange(pos)
                yield order
                rest = order[pos // b * b:]
                xw[:len(rest)], yw[:len(rest)], iw[:len(rest)] = xw[rest], yw[rest], iw[rest]
                pos = len(rest)
        if pos:
            yield rng.permutation(pos) if ld.shuffle_window else np.arange(pos)
