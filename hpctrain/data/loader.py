"""Per-rank training batches from a :class:`ShardSet`: the pieces put together, one thread ahead.

:class:`ShardLoader` gives each rank exactly ``steps`` batches of ``batch_size`` samples per
epoch, the same global batches at any rank count that divides ``lanes`` (docs/data.md). Its
parts, one concern each:

- :mod:`windowread`: the epoch's plan read as contiguous runs into a window, shuffled there;
- :mod:`reading`: who reads (the rank itself, or one reader rank per node through an MPI-3
  shared window, :mod:`noderead`), a strategy object;
- :mod:`jpegstream`: JPEG decoding on the rank's decode pool (a batch ahead, crops cut at decode);
- :mod:`prefetch`: the background thread that does everything per batch but the decoding, keeps
  ``prefetch`` finished batches queued and runs on into the next epoch; :class:`LoaderStats`
  records how long the training thread waited for it (``wait_s``).

Evaluation's batches are :mod:`evalbatches`'.

Raw batches (``raw=True``, what a job training on a GPU asks for): the thread hands over the
samples as stored (uint8 images stay uint8: a quarter of float32's bytes across PCIe), pinned
when CUDA is available so the consumer's ``x.to(device, non_blocking=True)`` is an asynchronous
DMA; normalisation and augmentation are then the consumer's, on the device, through
:meth:`ShardLoader.batch_prep` (the same :class:`~hpctrain.data.augment.BatchPrep` the thread runs
otherwise, so the batches are the same either way).
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator

import numpy as np
import torch

from hpctrain.data import plan
from hpctrain.data.augment import BatchPrep, Normalize, PositionDraws
from hpctrain.data.jpegstream import JpegBatches
from hpctrain.data.prefetch import EpochsAhead, LoaderStats
from hpctrain.data.reading import NodeReading, RankReading
from hpctrain.data.shards import ShardSet
from hpctrain.data.windowread import WindowReader

__all__ = ["LoaderStats", "ShardLoader", "host_tensor"]


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
        self.windows = WindowReader(self)
        self.reading: RankReading | NodeReading = (RankReading(self) if node_comm is None
                                                   else NodeReading(self, node_comm, node_slots))
        self.jpeg = (JpegBatches(self, workers, jpeg_backend, decode, decode_device)
                     if shards.index.encoding == "jpeg" else None)
        self._ahead = EpochsAhead(self._batches, self.reading, prefetch, self.stats)

    def __len__(self) -> int:
        return self.steps

    def describe(self) -> str:
        """One line for the start-up log: reading mode, HDF5 driver, augmentation."""
        raw = (f"; raw {self.shards.index.dtype} batches{' (pinned)' if self.pin else ''}, normalised on the device"
               if self.raw else "")
        jpeg = f"; {self.jpeg.describe()}" if self.jpeg else ""
        lanes = f"; {self.lanes} data lanes, {self.lanes // self.size} per rank" if self.lanes != self.size else ""
        return (f"{self.reading.describe()}{lanes}; {self.shards.describe()}; augment {self.transform or 'off'}; "
                f"prefetch {self.prefetch}{jpeg}{raw}")

    def runs(self, epoch: int, lane: int) -> Iterator[tuple[int, int]]:
        """``lane``'s runs this epoch, computed lazily (:func:`plan.iter_rank_runs`)."""
        return self.windows.runs(epoch, lane)

    def rank_lanes(self, rank: int) -> range:
        """The lanes rank ``rank`` reads: its contiguous ``lanes / size`` of them."""
        return self.windows.rank_lanes(rank)

    def position(self, step: int, rank: int | None = None) -> int:
        """The place of ``rank``'s first sample of batch ``step`` in the epoch's sequence of global
        batches: what seeds each sample's augmentation, the same at any rank count."""
        return step * self.global_batch + (self.rank if rank is None else rank) * self.batch_size

    def window_ids(self, rank: int) -> np.ndarray:
        """The global sample ids of ``rank``'s window buffer, as :meth:`window_batches` last filled it."""
        return self.windows.window_ids(rank)

    def window_batches(self, epoch: int, skip: int = 0,
                       rank: int | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``rank``'s batches as ``(x_window, y_window, indices)``: valid until the next item
        (:meth:`WindowReader.window_batches`)."""
        return self.windows.window_batches(epoch, skip, self.rank if rank is None else rank)

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
                      and self.jpeg.on_device is None and self.reading.workers_normalize)
        source = self.reading.batches(epoch, skip, augment, prep.normalize if in_workers and prep else None)
        for x, y in source:
            t0 = time.perf_counter()
            t = host_tensor(x, self.pin) if prep is None else x if in_workers else prep(x)     # None: raw
            self.stats.prep_s += time.perf_counter() - t0
            self.stats.batches += 1
            yield t, host_tensor(y, self.pin)

    def epoch(self, epoch: int, skip: int = 0, augment: bool = True) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's batches for ``epoch`` (``skip`` batches already done, for resume).

        With ``augment=False`` the same batches come without the transform. An epoch may be
        abandoned part-way: the next call restarts the background thread.
        """
        if self.prefetch:
            return self._ahead.epoch(epoch, skip, augment)
        self.reading.start(epoch, skip, augment)
        return self._batches(epoch, skip, augment)

    def close(self) -> None:
        """Stop background threads; with a node reader this frees the window (collective on the node);
        closes the shards when the loader owns them (collective with ``mpio``)."""
        self.reading.cancel()
        self._ahead.stop()
        self.reading.close()
        if self.jpeg is not None:
            self.jpeg.close()
        if self.owns_shards:
            self.shards.close()
            self.owns_shards = False
