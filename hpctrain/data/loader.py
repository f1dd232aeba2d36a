"""Per-rank batches from a :class:`ShardSet`: contiguous reads, in-memory window shuffle, prefetch.

Training: each epoch the rank reads its runs from :func:`plan.rank_runs` as long slices, shuffles
within a window of ``shuffle_window`` samples (generator seeded by ``(seed, epoch, rank)``: the
named per-rank offset), and yields exactly ``steps`` batches of ``batch_size`` samples, so every
rank takes the same number of steps. A background thread keeps ``prefetch`` batches ready.
Evaluation: each rank reads its balanced contiguous share in order, partial last batch kept.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

import numpy as np
import torch

from hpctrain.data import plan
from hpctrain.data.shards import ShardSet


def normalizer(normalize: dict, n_channels: int) -> Callable[[np.ndarray], torch.Tensor]:
    """Raw samples → float32 tensor, (x - mean) / std per channel (from the shard index)."""
    mean = np.asarray(normalize.get("mean", [0.0] * n_channels), np.float32)
    std = np.asarray(normalize.get("std", [1.0] * n_channels), np.float32)
    shape = (1, -1) + (1,) * 8  # trimmed below to the sample rank

    def apply(x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(x)).float()
        view = shape[: t.dim()]
        return (t - torch.from_numpy(mean).view(view)) / torch.from_numpy(std).view(view)
    return apply


class _Prefetcher:
    """Runs a batch generator in a thread; exceptions are re-raised in the consumer."""
    _DONE = object()

    def __init__(self, gen: Iterator, depth: int):
        self._q: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._t = threading.Thread(target=self._run, args=(gen,), daemon=True)
        self._t.start()

    def _run(self, gen):
        try:
            for item in gen:
                self._q.put(item)
        except BaseException as exc:  # forwarded, not swallowed
            self._q.put(exc)
        self._q.put(self._DONE)

    def __iter__(self):
        while (item := self._q.get()) is not self._DONE:
            if isinstance(item, BaseException):
                raise item
            yield item


class ShardLoader:
    """Training batches for one rank. ``batch_size`` is the per-rank batch."""

    def __init__(self, shards: ShardSet, *, rank: int, size: int, batch_size: int, seed: int = 0,
                 block_size: int = 32, shuffle_window: int = 1024, prefetch: int = 2,
                 drop_last: bool = True, transform: Callable | None = None):
        self.shards, self.rank, self.size = shards, rank, size
        self.batch_size, self.seed, self.block_size = batch_size, seed, block_size
        self.shuffle_window, self.prefetch, self.drop_last = shuffle_window, prefetch, drop_last
        self.global_batch = batch_size * size
        self.steps = plan.steps_per_epoch(shards.num_samples, self.global_batch, drop_last)
        self.transform = transform
        idx = shards.index
        self.to_tensor = normalizer(idx.normalize, idx.sample_shape[0] if idx.sample_shape else 1)

    def __len__(self) -> int:
        return self.steps

    def runs(self, epoch: int) -> list[tuple[int, int]]:
        total = None if self.drop_last else self.steps * self.global_batch
        return plan.rank_runs(self.shards.num_samples, self.size, self.rank, epoch=epoch, seed=self.seed,
                              block_size=self.block_size, total=total)

    def _raw_batches(self, epoch: int, skip: int = 0):
        rng = np.random.default_rng([self.seed, epoch, 1 + self.rank])  # per-rank offset: 1 + rank
        window = max(self.shuffle_window, self.batch_size)
        pend_x, pend_y, emitted = [], [], 0
        pending = 0

        def drain(final: bool):
            nonlocal pend_x, pend_y, pending, emitted
            x, y = np.concatenate(pend_x), np.concatenate(pend_y)
            perm = rng.permutation(len(x)) if self.shuffle_window else np.arange(len(x))
            x, y = x[perm], y[perm]
            n_full = len(x) // self.batch_size * self.batch_size
            for s in range(0, n_full, self.batch_size):
                if emitted >= self.steps:
                    break
                if emitted >= skip:
                    yield x[s:s + self.batch_size], y[s:s + self.batch_size]
                emitted += 1
            pend_x, pend_y = [x[n_full:]], [y[n_full:]]
            pending = len(x) - n_full

        for a, b in self.runs(epoch):
            for s in range(a, b, window):
                x, y = self.shards.read_range(s, min(b, s + window))
                pend_x.append(x)
                pend_y.append(y)
                pending += len(x)
                if pending >= window:
                    yield from drain(False)
        if pending:
            yield from drain(True)

    def _batches(self, epoch: int, skip: int):
        for x, y in self._raw_batches(epoch, skip):
            t = self.to_tensor(x)
            if self.transform is not None:
                t = self.transform(t)
            yield t, torch.from_numpy(y)

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batches for ``epoch`` (``skip`` batches already done, for resume)."""
        gen = self._batches(epoch, skip)
        return iter(_Prefetcher(gen, self.prefetch)) if self.prefetch else gen


def eval_batches(shards: ShardSet, *, rank: int, size: int, batch_size: int):
    """This rank's contiguous share of an evaluation split, in order; last batch may be short."""
    idx = shards.index
    to_tensor = normalizer(idx.normalize, idx.sample_shape[0] if idx.sample_shape else 1)
    lo, hi = plan.block_range(shards.num_samples, size, rank)
    for s in range(lo, hi, batch_size):
        x, y = shards.read_range(s, min(hi, s + batch_size))
        yield to_tensor(x), torch.from_numpy(y)
