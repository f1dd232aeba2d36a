"""Who reads a rank's batches: the rank itself, or its node's reader rank (``data.reader``).

A :class:`~hpctrain.data.loader.ShardLoader` holds one of these strategies and asks it, not a
flag, how an epoch starts, where its batches come from and how it ends:

================  ==============================================================================
``RankReading``   each rank reads its own batches (window reads, JPEG decoded on its own pool)
``NodeReading``   one reader rank per node fills an MPI-3 shared window for the node's ranks
                  (:mod:`noderead`): fewer processes on a parallel file system
================  ==============================================================================
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hpctrain.data.noderead import NodeReader


class RankReading:
    """Each rank reads its own batches."""
    node_level = False
    per_epoch = False          # the loader's thread runs on into the next epoch
    workers_normalize = True   # JPEG decode workers may normalise too (same bits, in parallel)

    def __init__(self, loader):
        self.loader = loader

    def describe(self) -> str:
        return "per-rank reading"

    def start(self, epoch: int, skip: int, augment: bool) -> None:
        """Nothing to set up: the batches are read when asked for."""

    def batches(self, epoch: int, skip: int, augment: bool, normalize) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self.loader.decoded_batches(epoch, skip, augment=augment, normalize=normalize)

    def cancel(self) -> None:
        """Nothing waits outside the loader's own thread."""

    def close(self) -> None:
        """Nothing shared to free."""


class NodeReading:
    """One reader rank per node (:class:`~hpctrain.data.noderead.NodeReader`)."""
    node_level = True
    per_epoch = True           # the window protocol is per epoch: every local rank starts it in step
    workers_normalize = False  # the window's slots hold samples of the stored dtype

    def __init__(self, loader, node_comm, slots: int):
        from hpctrain.data.noderead import NodeReader  # imports mpi4py, which initialises MPI
        self.reader: NodeReader | None = NodeReader(loader, node_comm, slots=slots)

    def _open(self) -> NodeReader:
        if self.reader is None:
            raise RuntimeError("the loader is closed: its node window was freed")
        return self.reader

    def describe(self) -> str:
        return self._open().describe()

    def start(self, epoch: int, skip: int, augment: bool) -> None:
        """Begin ``epoch`` on every local rank (the reader rank's crops follow ``augment``)."""
        reader = self._open()
        reader.augment = augment
        reader.start(epoch, skip)

    def batches(self, epoch: int, skip: int, augment: bool, normalize) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self._open().batches(epoch, skip)

    def cancel(self) -> None:
        """Make this rank's waits on the window give up and stop the reader's producer."""
        if self.reader is not None:
            self.reader.cancel()

    def close(self) -> None:
        """Free the window (collective on the node); a second call does nothing."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
