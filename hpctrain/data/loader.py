"""Per-rank batches from a :class:`ShardSet`: contiguous reads, in-memory window shuffle, prefetch.

Training: the epoch's permuted sequence is dealt to ``lanes`` lanes (by default one per rank), each
a balanced contiguous share, computed lazily a chunk at a time (:func:`plan.iter_rank_runs`); a
lane reads its runs as long slices, shuffles within a window of ``shuffle_window`` samples
(generator seeded by ``(seed, epoch, lane)``) and gives ``global_batch / lanes`` samples to each
global batch. Rank ``r`` of ``n`` holds lanes ``r·L/n .. (r+1)·L/n`` and yields exactly ``steps``
batches, its lanes' shares side by side, so every rank takes the same number of steps. With
``lanes`` fixed, global batch ``k`` (its samples, in order) is the same at any rank count that
divides ``lanes``: the run does not depend on how many ranks read it (docs/data.md).
One background thread does everything per batch — HDF5 reads, window shuffle,
normalisation, augmentation — except JPEG decoding, which it hands to the rank's decode pool
(:mod:`jpegstream`, :mod:`decodepool`: a batch ahead, crops cut at decode), and keeps ``prefetch``
finished batches queued; the training thread only waits when that thread falls behind, and
:attr:`ShardLoader.stats` records how long (``wait_s``), so the data-wait share of a step is
measured, not guessed.

With ``node_comm`` (``Topology.intra``) one reader rank per node reads the batches of all the
node's ranks into an MPI-3 shared-memory window (:mod:`noderead`); each rank still gets exactly
the batches it would have read itself. Evaluation's batches are :mod:`evalbatches`'.

Raw batches (``raw=True``, what a job training on a GPU asks for): the thread hands over the
samples as stored (uint8 images stay uint8: a quarter of float32's bytes across PCIe), pinned
when CUDA is available so the consumer's ``x.to(device, non_blocking=True)`` is an asynchronous
DMA; normalisation and augmentation are then the consumer's, on the device, through
:meth:`ShardLoader.batch_prep` (the same :class:`~hpctrain.data.augment.BatchPrep` the thread runs
otherwise, so the batches are the same either way).
"""
from __future__ import annotations

import functools
import queue
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable, Iterator

import numpy as np
import torch

from hpctrain.data import plan
from hpctrain.data.augment import BatchPrep, Normalize, PositionDraws
from hpctrain.data.jpegstream import JpegBatches
from hpctrain.data.shards import ShardSet


@dataclass
class LoaderStats:
    """Seconds spent per stage since creation (or :meth:`reset`); the stages run in the thread."""
    wait_s: float = 0.0        # training thread blocked on the queue (the cost that is paid)
    read_s: float = 0.0        # HDF5 reads (or, with a node reader, taking the batch from the window)
    decode_s: float = 0.0      # JPEG decoding
    prep_s: float = 0.0        # normalisation + augmentation (raw batches: pinning)
    batches: int = 0

    def reset(self) -> None:
        self.wait_s = self.read_s = self.decode_s = self.prep_s = 0.0
        self.batches = 0


_END = object()      # closes an epoch in the prefetch queue


class _Prefetcher:
    """Runs a batch generator in a thread; exceptions are re-raised in the consumer."""
    _DONE = object()

    def __init__(self, gen: Iterator, depth: int, stats: LoaderStats):
        self._q: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._stats = stats
        self._t = threading.Thread(target=self._run, args=(gen,), daemon=True, name="hpctrain-loader")
        self._t.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, gen):
        try:
            for item in gen:
                if not self._put(item):
                    return
        except BaseException as exc:  # forwarded, not swallowed
            self._put(exc)
        self._put(self._DONE)

    def __iter__(self):
        while True:
            t0 = time.perf_counter()
            item = self._q.get()
            self._stats.wait_s += time.perf_counter() - t0
            if item is self._DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop the thread (it may be blocked on a full queue after an abandoned epoch)."""
        self._stop.set()
        self._t.join()


def host_tensor(a: np.ndarray, pin: bool) -> torch.Tensor:
    """``a`` as a tensor of its own dtype, copied into page-locked memory when ``pin`` (a tensor
    already on a device, from the GPU decode, or a contiguous one not to pin, as it is: the same
    object, with what the decode attached to it)."""
    if isinstance(a, torch.Tensor) and (a.device.type != "cpu" or (not pin and a.is_contiguous())):
        return a
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.pin_memory() if pin else t


def _unchanged(x: torch.Tensor) -> torch.Tensor:
    return x


class ShardLoader:
    """Training batches for one rank. ``batch_size`` is the per-rank batch.

    ``transform(x, generator)`` (e.g. :class:`augment.Augment`) runs on normalised batches;
    ``epoch(e, augment=False)`` skips it (Final Polishing's un-augmented pass). With ``raw`` the
    batches come as stored (pinned when CUDA is available) and :meth:`batch_prep` says what to
    apply to them, on the device they were copied to.
    """

    def __init__(self, shards: ShardSet, *, rank: int, size: int, batch_size: int, seed: int = 0,
                 block_size: int = 32, shuffle_window: int = 1024, prefetch: int = 2,
                 drop_last: bool = True, transform: Callable | None = None, node_comm=None,
                 node_slots: int = 2, raw: bool = False, workers: int = 1, jpeg_backend: str = "auto",
                 decode: str = "cpu", decode_device: torch.device | None = None, lanes: int = 0):
        self.shards, self.rank, self.size = shards, rank, size
        self.lanes = lanes or size                 # 0: one lane per rank
        problem = plan.lane_problem(self.lanes, size, batch_size * size)
        if problem:
            raise ValueError(f"lanes: {problem}")
        self.batch_size, self.seed, self.block_size = batch_size, seed, block_size
        self.shuffle_window, self.prefetch, self.drop_last = shuffle_window, prefetch, drop_last
        self.global_batch = batch_size * size
        self.steps = plan.steps_per_epoch(shards.num_samples, self.global_batch, drop_last)
        self.transform = transform
        self.raw = raw
        self.pin = raw and torch.cuda.is_available()   # page-locked only where a GPU copies from it
        self.to_tensor = Normalize.of(shards.index)
        self.stats = LoaderStats()
        self.owns_shards = False                   # close() closes the ShardSet too (factory loaders)
        self._bufs: dict = {}
        self._active: _Prefetcher | None = None
        self._resume_at: tuple | None = None       # (epoch, augment) the running thread is at
        self._ids: dict = {}                       # rank -> global sample ids of its window buffer
        self.node = None
        if node_comm is not None:
            from hpctrain.data.noderead import NodeReader
            self.node = NodeReader(self, node_comm, slots=node_slots)
        self.jpeg = (JpegBatches(self, workers, jpeg_backend, decode, decode_device)
                     if shards.index.encoding == "jpeg" else None)

    def __len__(self) -> int:
        return self.steps

    def describe(self) -> str:
        """One line for the start-up log: reading mode, HDF5 driver, augmentation."""
        mode = self.node.describe() if self.node else "per-rank reading"
        raw = (f"; raw {self.shards.index.dtype} batches{' (pinned)' if self.pin else ''}, normalised on the device"
               if self.raw else "")
        jpeg = f"; {self.jpeg.describe()}" if self.jpeg else ""
        lanes = f"; {self.lanes} data lanes, {self.lanes // self.size} per rank" if self.lanes != self.size else ""
        return (f"{mode}{lanes}; {self.shards.describe()}; augment {self.transform or 'off'}; prefetch {self.prefetch}"
                f"{jpeg}{raw}")

    def runs(self, epoch: int, lane: int) -> Iterator[tuple[int, int]]:
        """``lane``'s runs this epoch, computed lazily (:func:`plan.iter_rank_runs`)."""
        total = None if self.drop_last else self.steps * self.global_batch
        return plan.iter_rank_runs(self.shards.num_samples, self.lanes, lane,
                                   epoch=epoch, seed=self.seed, block_size=self.block_size, total=total)

    def rank_lanes(self, rank: int) -> range:
        """The lanes rank ``rank`` reads: its contiguous ``lanes / size`` of them."""
        per = self.lanes // self.size
        return range(rank * per, (rank + 1) * per)

    def position(self, step: int, rank: int | None = None) -> int:
        """The place of ``rank``'s first sample of batch ``step`` in the epoch's sequence of global
        batches: what seeds each sample's augmentation, the same at any rank count."""
        return step * self.global_batch + (self.rank if rank is None else rank) * self.batch_size

    def _buffers(self, key, capacity: int):
        """Window buffers by ``key``, kept across epochs (fresh pages cost more than the copy)."""
        jpeg = self.shards.index.encoding == "jpeg"
        key = (key, capacity)
        if key not in self._bufs:
            x = np.empty(capacity, object) if jpeg else np.empty((capacity, *self.shards.index.sample_shape),
                                                                 self.shards.index.dtype)
            self._bufs[key] = (x, np.empty(capacity, np.int64), np.empty(capacity, np.int64))
        return self._bufs[key]

    def window_ids(self, rank: int) -> np.ndarray:
        """The global sample ids of ``rank``'s window buffer, as :meth:`window_batches` last filled it."""
        return self._ids[rank]

    def window_batches(self, epoch: int, skip: int = 0,
                       rank: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``rank``'s batches as ``(x_window, y_window, indices)``: valid until the next item.

        The runs are read straight into a reused window buffer per lane (``read_direct``); each
        lane's share is a random subset of its window. One lane per rank: the batch is gathered
        from the window by the caller (the only copy after the read); several: their shares are
        first copied side by side into a batch buffer.
        """
        rank = self.rank if rank is None else rank
        lanes = self.rank_lanes(rank)
        b = self.batch_size // len(lanes)
        gens = [self._lane_batches(epoch, lane, b) for lane in lanes]
        if len(gens) == 1:
            for emitted, (xw, yw, iw, idx) in enumerate(gens[0]):
                if emitted >= self.steps:
                    return
                self._ids[rank] = iw
                if emitted >= skip:
                    yield xw, yw, idx
            return
        xb, yb, ib = self._buffers(("batch", rank), self.batch_size)
        self._ids[rank] = ib
        whole = np.arange(self.batch_size)
        for emitted, shares in enumerate(zip(*gens)):
            if emitted >= self.steps:
                return
            if emitted < skip:
                continue
            for j, (xw, yw, iw, idx) in enumerate(shares):
                xb[j * b:(j + 1) * b], yb[j * b:(j + 1) * b], ib[j * b:(j + 1) * b] = xw[idx], yw[idx], iw[idx]
            yield xb, yb, whole

    def _lane_batches(self, epoch: int, lane: int, b: int):
        """``lane``'s shares of the epoch's global batches, ``b`` samples each, as
        ``(x_window, y_window, ids_window, indices)``."""
        window = max(self.shuffle_window, b)
        xw, yw, iw = self._buffers(("lane", lane), 2 * window)
        for order in self._windows(epoch, lane, xw, yw, window, iw, b):
            for k in range(0, len(order) // b * b, b):
                yield xw, yw, iw, order[k:k + b]

    def _windows(self, epoch: int, lane: int, xw: np.ndarray, yw: np.ndarray, window: int, iw: np.ndarray,
                 b: int):
        """Fill the window buffers run by run; yield the shuffled order of each full window (and
        of the last, partial one). When the caller asks for the next window, the samples left past
        the last whole share move to the front and the window fills up behind them."""
        rng = np.random.default_rng([self.seed, epoch, 1 + lane])  # per-lane offset: 1 + lane
        pos = 0
        for a, stop in self.runs(epoch, lane):
            for s in range(a, stop, window):
                e = min(stop, s + window)
                t0 = time.perf_counter()
                self.shards.read_into(s, e, xw[pos:], yw[pos:])
                self.stats.read_s += time.perf_counter() - t0
                iw[pos:pos + e - s] = np.arange(s, e)
                pos += e - s
                if pos < window:
                    continue
                order = rng.permutation(pos) if self.shuffle_window else np.arange(pos)
                yield order
                rest = order[pos // b * b:]
                xw[:len(rest)], yw[:len(rest)], iw[:len(rest)] = xw[rest], yw[rest], iw[rest]
                pos = len(rest)
        if pos:
            yield rng.permutation(pos) if self.shuffle_window else np.arange(pos)

    def raw_batches(self, epoch: int, skip: int = 0,
                    rank: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``rank``'s batches as read from the shards (encoded for JPEG), window-shuffled."""
        for xw, yw, idx in self.window_batches(epoch, skip, rank):
            yield xw[idx], yw[idx]

    def decoded_batches(self, epoch: int, skip: int = 0, rank: int | None = None, augment: bool = True,
                        normalize: Normalize | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Like :meth:`raw_batches`, with JPEG samples decoded to ``sample_shape`` uint8 on the
        decode workers (crops cut at decode for whole-image shards: :mod:`jpegstream`); with
        ``normalize``, JPEG batches come normalised by the workers (float32 tensors)."""
        if self.jpeg is None:
            yield from self.raw_batches(epoch, skip, rank)
            return
        yield from self.jpeg.batches(epoch, skip, self.rank if rank is None else rank, augment, normalize)

    def _prep(self, epoch: int, augment: bool, skip: int) -> BatchPrep:
        cut = self.jpeg is not None and self.jpeg.train_crops     # the crop was cut at decode time
        transform = self.transform if augment and not cut else None
        gen_at = (functools.partial(PositionDraws.of_step, self.seed, epoch, self.global_batch,
                                    self.position(0)) if transform is not None else None)
        return BatchPrep(self.to_tensor, transform, gen_at, step=skip)

    def batch_prep(self, epoch: int, augment: bool = True, skip: int = 0) -> Callable[[torch.Tensor], torch.Tensor]:
        """What the consumer still applies to each ``x`` of ``epoch(epoch, skip, augment)``, on
        the device it copied ``x`` to: with ``raw`` batches, the epoch's :class:`BatchPrep`
        (normalisation, augmentation with each batch's own generator, from batch ``skip`` on, in
        batch order); otherwise nothing (the thread has applied it). Make it when the epoch
        starts, with the same ``skip``."""
        return self._prep(epoch, augment, skip) if self.raw else _unchanged

    def _batches(self, epoch: int, skip: int, augment: bool):
        prep = None if self.raw else self._prep(epoch, augment, skip)
        # JPEG decoded on the host with nothing after the normalisation: the decode workers normalise
        # (same bits, in parallel); batches decoded on the device are normalised there, by ``prep``
        in_workers = (prep is not None and prep.transform is None and self.jpeg is not None
                      and self.jpeg.on_device is None and not self.node)
        source = self.node.batches(epoch, skip) if self.node else self.decoded_batches(
            epoch, skip, augment=augment, normalize=prep.normalize if in_workers and prep else None)
        for x, y in source:
            t0 = time.perf_counter()
            t = host_tensor(x, self.pin) if prep is None else x if in_workers else prep(x)     # None: raw
            self.stats.prep_s += time.perf_counter() - t0
            self.stats.batches += 1
            yield t, host_tensor(y, self.pin)

    def _stream(self, epoch: int, skip: int, augment: bool):
        """Epoch after epoch, each closed by ``_END``: the thread runs on into the next epoch, so
        its first batches are ready when the training loop asks for them (not with a node reader,
        whose window protocol is per epoch)."""
        while True:
            yield from self._batches(epoch, skip, augment)
            yield _END
            if self.node:
                return
            epoch, skip = epoch + 1, 0

    def _take(self, it, epoch: int, augment: bool):
        for item in it:
            if item is _END:
                self._resume_at = None if self.node else (epoch + 1, augment)
                return
            yield item

    def epoch(self, epoch: int, skip: int = 0, augment: bool = True) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batches for ``epoch`` (``skip`` batches already done, for resume).

        With ``augment=False`` the same batches come without the transform. An epoch may be
        abandoned part-way: the next call restarts the background thread.
        """
        if not self.prefetch:
            return self._batches(epoch, skip, augment) if not self.node else self._node_epoch(epoch, skip, augment)
        if self._active is not None and not skip and self._resume_at == (epoch, augment):
            self._resume_at = None
            return self._take(iter(self._active), epoch, augment)
        if self.node:
            self.node.cancel()      # unblocks a thread still waiting on the window
        self._stop_active()
        if self.node:
            self.node.augment = augment
            self.node.start(epoch, skip)
        self._active = _Prefetcher(self._stream(epoch, skip, augment), self.prefetch, self.stats)
        return self._take(iter(self._active), epoch, augment)

    def _node_epoch(self, epoch: int, skip: int, augment: bool):
        assert self.node is not None
        self.node.augment = augment
        self.node.start(epoch, skip)
        return self._batches(epoch, skip, augment)

    def _stop_active(self) -> None:
        self._resume_at = None
        if self._active is not None:
            self._active.close()
            self._active = None

    def close(self) -> None:
        """Stop background threads; with a node reader this frees the window (collective on the node);
        closes the shards when the loader owns them (collective with ``mpio``)."""
        if self.node:
            self.node.cancel()
        self._stop_active()
        if self.node:
            self.node.close()
            self.node = None
        if self.jpeg is not None:
            self.jpeg.close()
        if self.owns_shards:
            self.shards.close()
            self.owns_shards = False

