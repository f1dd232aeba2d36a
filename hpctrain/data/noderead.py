"""Node-level reading: one reader rank per node fills an MPI-3 shared-memory window for the node.

The node's local rank 0 reads, for every rank of the node, exactly the batches that rank would
have read itself (same plan, same window shuffle: :meth:`ShardLoader.decoded_batches` with that
rank's world rank), and writes them into a ring of ``slots`` slots in a window made by
``Win.Allocate_shared`` on the node communicator (``Topology.intra``). Each rank copies its batch
out of the window and normalises/augments it in its own loader thread. Fewer processes touch the
file system (one per node instead of one per rank), which is what matters on a parallel file
system at scale; on one host it mostly adds a copy (see ``hpctrain bench io``).

Synchronisation is through the window itself, passive target (``Lock_all`` + ``Win.Sync`` as the
memory barrier, the MPI-3 shared-memory pattern of Hoefler et al., "MPI+MPI", Computing 2013):
``ready[slot]`` holds the sequence number of the batch in the slot, ``taken[slot, local_rank]``
the last one each rank copied out. Sequence numbers are ``call * 2**32 + step + 1`` where
``call`` counts :meth:`start` calls, identical on the node's ranks because they train in step.
JPEG shards are decoded by the reader rank on its decode workers, with each rank's own crops
(the slots have a fixed size). The reader's shards
are SHA-256-checked (``shard_checks.py``); the other ranks of the node trust its verdict.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from hpctrain.data.index import ShardError

SEQ_STRIDE = 1 << 32
ERROR_GRACE_S = 5.0   # a rank that sees the reader fail waits this long for the reader to end the job
_ALIGN = 64


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class NodeReader:
    """The shared ring of batch slots of one node; local rank 0 is the reader."""

    def __init__(self, loader, node_comm: MPI.Comm, slots: int = 2):
        self.loader, self.comm, self.slots = loader, node_comm, max(int(slots), 1)
        self.augment = True          # the loader sets it before each start (crops cut at decode)
        self.local_rank, self.local_size = node_comm.Get_rank(), node_comm.Get_size()
        self.ranks = node_comm.allgather(loader.rank)       # world rank of each local rank
        # the reader checked the shards' SHA-256 (same files): the others' sets need not hash them
        # again when read outside the window (the job's model check, hpctrain.job.setup, reads two samples)
        verified = node_comm.bcast(sorted(loader.shards.checks.verified) if self.local_rank == 0 else None, root=0)
        if self.local_rank:
            loader.shards.mark_verified(verified)
        idx = loader.shards.index
        self.shape, self.dtype = tuple(idx.sample_shape), np.dtype(idx.dtype)
        b = loader.batch_size
        x_bytes = b * math.prod(self.shape) * self.dtype.itemsize
        n_ctrl = 1 + self.slots + self.slots * self.local_size          # error, ready, taken
        ctrl_bytes = _round_up(8 * n_ctrl)
        self.x_bytes, self.y_bytes = _round_up(x_bytes), _round_up(8 * b)
        slot_bytes = self.local_size * (self.x_bytes + self.y_bytes)
        total = ctrl_bytes + self.slots * slot_bytes
        self.win = MPI.Win.Allocate_shared(total if self.local_rank == 0 else 0, 1, comm=node_comm)  # type: ignore[arg-type]  # an Intracomm (stub: Split returns Comm)
        buf, _ = self.win.Shared_query(0)
        mem = np.frombuffer(buf, np.uint8, count=total)  # type: ignore[call-overload]  # numpy stub: buffers only on 3.12+
        ctrl = mem[:8 * n_ctrl].view(np.int64)
        self.error = ctrl[0:1]
        self.ready = ctrl[1:1 + self.slots]
        self.taken = ctrl[1 + self.slots:].reshape(self.slots, self.local_size)
        self.xs, self.ys = [], []
        for s in range(self.slots):
            base = ctrl_bytes + s * slot_bytes
            xs, ys = [], []
            for j in range(self.local_size):
                off = base + j * (self.x_bytes + self.y_bytes)
                xs.append(mem[off:off + x_bytes].view(self.dtype).reshape(b, *self.shape))
                ys.append(mem[off + self.x_bytes:off + self.x_bytes + 8 * b].view(np.int64))
            self.xs.append(xs)
            self.ys.append(ys)
        if self.local_rank == 0:
            ctrl[:] = 0
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.win.Sync()
        node_comm.Barrier()
        self.calls, self.base = 0, 0
        self._cancel = threading.Event()
        self._producer: threading.Thread | None = None
        self._exc: BaseException | None = None

    def describe(self) -> str:
        return (f"node-level reading (local rank 0 reads for {self.local_size} ranks into an MPI-3 shared "
                f"window of {self.slots} slots)")

    def cancel(self) -> None:
        """Make this rank's waits give up (the epoch is being abandoned) and stop the producer."""
        self._cancel.set()
        if self._producer is not None:
            self._producer.join()
            self._producer = None

    def start(self, epoch: int, skip: int) -> None:
        """Begin ``epoch`` at step ``skip`` on this rank (every local rank calls it, in step)."""
        self.cancel()
        self.calls += 1
        self.base = self.calls * SEQ_STRIDE
        self.taken[:, self.local_rank] = self.base + skip   # release every slot of older calls
        self.win.Sync()
        self._cancel = threading.Event()
        if self.local_rank == 0:
            self._producer = threading.Thread(target=self._produce, args=(epoch, skip, self.base, self._cancel),
                                              daemon=True, name="hpctrain-node-reader")
            self._producer.start()

    def _wait(self, pred, cancel: threading.Event) -> bool:
        delay = 2e-5
        while True:
            self.win.Sync()
            if pred():
                return True
            if self.error[0]:
                if self._exc is not None:
                    raise self._exc
                time.sleep(ERROR_GRACE_S)     # the reader's own line and abort come first, usually alone
                raise ShardError(f"node reader (world rank {self.ranks[0]}) failed; see its error")
            if cancel.is_set():
                return False
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def _produce(self, epoch: int, skip: int, base: int, cancel: threading.Event) -> None:
        try:
            jpeg = self.loader.shards.index.encoding == "jpeg"
            gens = [self.loader.window_batches(epoch, skip, rank=r) for r in self.ranks]
            for t in range(skip, self.loader.steps):
                s, seq = t % self.slots, base + t + 1
                if not self._wait(lambda: bool((self.taken[s] >= seq - self.slots).all()), cancel):  # noqa: B023
                    return
                for j, gen in enumerate(gens):
                    xw, yw, idx = next(gen)
                    if jpeg:          # that rank's crops, on the reader's decode workers
                        ids = self.loader.window_ids(self.ranks[j])[idx]
                        jb = self.loader.jpeg
                        jb.finish(jb.submit(xw, idx, ids, epoch, self.ranks[j], t, self.augment, out=self.xs[s][j]))
                    else:
                        slot = self.xs[s][j]
                        for k, i in enumerate(idx):   # gather straight into the window (np.take(out=) is slower)
                            slot[k] = xw[i]
                    self.ys[s][j][...] = yw[idx]
                self.win.Sync()
                self.ready[s] = seq
                self.win.Sync()
        except BaseException as exc:
            self._exc = exc
            self.error[0] = 1
            self.win.Sync()

    def batches(self, epoch: int, skip: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """This rank's batches of the current call, copied out of the window."""
        base, cancel, me = self.base, self._cancel, self.local_rank
        for t in range(skip, self.loader.steps):
            s, seq = t % self.slots, base + t + 1
            if not self._wait(lambda: int(self.ready[s]) == seq, cancel):  # noqa: B023 (polled here, not kept)
                return
            x, y = self.xs[s][me].copy(), self.ys[s][me].copy()
            self.win.Sync()
            self.taken[s, me] = seq
            self.win.Sync()
            yield x, y

    def close(self) -> None:
        """Stop the producer and free the window (collective over the node communicator)."""
        self.cancel()
        self.xs = self.ys = []
        self.error = self.ready = self.taken = None
        self.win.Unlock_all()
        self.win.Free()
