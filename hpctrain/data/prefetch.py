"""The loader's background thread: batches made ahead, epoch after epoch, and where to pick up.

One thread runs a loader's batch stream and keeps ``depth`` finished batches queued; the
training thread only waits when the thread falls behind, and :class:`LoaderStats` records how
long (``wait_s``), so the data-wait share of a step is measured, not guessed. The stream runs on
into the next epoch (its first batches are ready when the loop asks for them) unless the reading
strategy's protocol is per epoch; :class:`EpochsAhead` remembers which epoch the running thread is
at, so the next :meth:`~EpochsAhead.epoch` call takes it over instead of starting again.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


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


END = object()      # closes an epoch in the prefetch queue


class Prefetcher:
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


class EpochsAhead:
    """A loader's epochs through one :class:`Prefetcher`, resumed where the thread already is.

    ``batches(epoch, skip, augment)`` makes one epoch's batches; ``reading`` is the loader's reading
    strategy (:mod:`hpctrain.data.reading`), started before each new thread and cancelled before
    the old one stops (a thread may be blocked on a node window).
    """

    def __init__(self, batches: Callable[[int, int, bool], Iterator], reading, depth: int, stats: LoaderStats):
        self._batches, self._reading, self._depth, self._stats = batches, reading, depth, stats
        self._active: Prefetcher | None = None
        self._resume_at: tuple | None = None       # (epoch, augment) the running thread is at

    def epoch(self, epoch: int, skip: int, augment: bool) -> Iterator:
        """``epoch``'s batches from batch ``skip`` on: the running thread's when it is at that
        epoch from its start, otherwise a fresh thread's."""
        if self._active is not None and not skip and self._resume_at == (epoch, augment):
            self._resume_at = None
            return self._take(iter(self._active), epoch, augment)
        self._reading.cancel()      # unblocks a thread still waiting on a node window
        self.stop()
        self._reading.start(epoch, skip, augment)
        self._active = Prefetcher(self._stream(epoch, skip, augment), self._depth, self._stats)
        return self._take(iter(self._active), epoch, augment)

    def _stream(self, epoch: int, skip: int, augment: bool):
        """Epoch after epoch, each closed by ``END`` (one epoch when the reading is per epoch)."""
        while True:
            yield from self._batches(epoch, skip, augment)
            yield END
            if self._reading.per_epoch:
                return
            epoch, skip = epoch + 1, 0

    def _take(self, it, epoch: int, augment: bool):
        for item in it:
            if item is END:
                self._resume_at = None if self._reading.per_epoch else (epoch + 1, augment)
                return
            yield item

    def stop(self) -> None:
        """Stop the thread, forgetting where it was."""
        self._resume_at = None
        if self._active is not None:
            self._active.close()
            self._active = None
