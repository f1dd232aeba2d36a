"""Gradient synchronisation: the interface every strategy implements, and the shared bucket code.

A strategy provides :meth:`GradSync.reduce_bucket`, a generator that turns ``bucket.flat`` (this
rank's gradients) into ``bucket.result`` (their mean over ranks) and returns the overflow flag
(see :mod:`hpctrain.comm.progress` for why a generator). Everything else lives here once:
fusion buckets in reverse order of use, copying gradients in and out, the overlap hooks, the
``begin``/``finish`` split (ChainerMN keeps the MPI plumbing in its base communicator the same
way). Buffers are allocated once at construction; the hot path allocates nothing.

Round protocol: ``begin()`` starts every bucket not started yet; ``finish()`` waits for all and
optionally writes the means into ``p.grad``; ``allreduce_grads()`` is the two in a row. With
``overlap=True`` a post-accumulate-grad hook starts a bucket during backward as soon as all its
parameters have their gradient, and every hook call polls the buckets in flight.

A second backward before ``finish()``: a started bucket already copied its gradients out of
``p.grad``, and autograd only ever writes ``p.grad``, so buffers in flight are never touched;
the new gradients accumulate in ``p.grad`` only and are *not* part of this round (a bucket is
reduced once per round). ``finish(scatter=True)`` then overwrites them with the round's means;
``finish(scatter=False)`` leaves them in ``p.grad`` for the next round. Buckets not yet started
when the second backward runs carry the accumulated gradients.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hpctrain.comm import compression as compression_lib
from hpctrain.comm.progress import Pending
from hpctrain.topology import Topology

DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass
class Bucket:
    """Parameters whose gradients travel together in one flat buffer."""
    params: list            # torch.nn.Parameter, in bucket order
    offsets: list           # element offset of each parameter in ``flat``
    flat: torch.Tensor      # 1-D buffer of this rank's gradients, dtype of the parameters
    index: int
    out: torch.Tensor = None      # where the mean lands in full precision: ``flat`` itself
                                  # (flat) or shared memory (hierarchical); treat as read-only
    wire: torch.Tensor = None     # compressed strategies: gradients are packed here instead of
    codec: object = None          # ``flat``, and the mean is left here, encoded, until read
    encoded: bool = False         # the current mean lives only in ``wire``

    @property
    def n_elems(self) -> int:
        return self.flat.numel()

    @property
    def result(self) -> torch.Tensor:
        """The mean over ranks after a round (decoded from the wire on first read)."""
        if self.encoded:
            self.codec.unpack(self.wire, [self.out])
            self.encoded = False
        return self.out

    def gather_grads(self, scale: float = 1.0) -> None:
        """This rank's gradients times ``scale`` into the bucket (zeros where a grad is missing).

        Scaling is free here (a multiply costs what the copy costs); a compressed bucket packs
        straight from the gradients into its wire buffer, replacing the copy.
        """
        if self.wire is not None:
            self.encoded = False
            grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                     for p in self.params]
            self.codec.pack(grads, self.wire, scale)
            return
        for p, off in zip(self.params, self.offsets):
            dst = self.flat[off:off + p.numel()]
            if p.grad is None:
                dst.zero_()
            elif scale == 1.0:
                dst.copy_(p.grad.reshape(-1))
            else:
                torch.mul(p.grad.reshape(-1), scale, out=dst)

    def scatter_grads(self) -> None:
        """Write the mean into each parameter's gradient (decoding straight into them if the
        mean is still encoded: one pass, like the copy it replaces)."""
        if self.encoded:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.empty_like(p)
            if all(p.grad.is_contiguous() for p in self.params):
                self.codec.unpack(self.wire, [p.grad for p in self.params])
                return
        src_all = self.result
        for p, off in zip(self.params, self.offsets):
            src = src_all[off:off + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = src.clone()
            else:
                p.grad.copy_(src)


def make_buckets(params, bucket_bytes: int, alloc=None) -> list[Bucket]:
    """Group parameters into buckets of about ``bucket_bytes``, last-used (last-defined) first.

    Backward produces gradients roughly in reverse definition order, so reversing lets the first
    bucket be complete earliest (PyTorch DDP and Horovod fuse the same way). Parameters of a
    different dtype start a new bucket. ``alloc(n_elems, dtype, index)`` provides each flat
    buffer (default: a fresh zeroed tensor; the hierarchical strategy hands out window memory).
    """
    alloc = alloc or (lambda n, dtype, i: torch.zeros(n, dtype=dtype))
    buckets, cur, cur_bytes = [], [], 0
    for p in reversed(list(params)):
        n_bytes = p.numel() * p.element_size()
        if cur and (cur_bytes + n_bytes > bucket_bytes or p.dtype != cur[0].dtype):
            buckets.append(cur)
            cur, cur_bytes = [], 0
        cur.append(p)
        cur_bytes += n_bytes
    if cur:
        buckets.append(cur)
    out = []
    for i, group in enumerate(buckets):
        offsets = np.cumsum([0] + [p.numel() for p in group[:-1]]).tolist()
        flat = alloc(sum(p.numel() for p in group), group[0].dtype, i)
        out.append(Bucket(params=group, offsets=offsets, flat=flat, index=i, out=flat))
    return out


def bucket_sizes(params, bucket_bytes: int) -> list[tuple[int, torch.dtype]]:
    """``(n_elems, dtype)`` of each bucket :func:`make_buckets` would build (allocates nothing)."""
    sizes = []
    make_buckets(params, bucket_bytes,
                 alloc=lambda n, dtype, i: sizes.append((n, dtype)) or torch.empty(0, dtype=dtype))
    return sizes


class GradSync:
    """Averages the gradients of ``params`` over ``topology.comm`` (the mean, as SSGD needs).

    Subclasses override :meth:`reduce_bucket`, and :meth:`_alloc`/:meth:`_setup`/:meth:`_free`
    when they own memory or communicators. Call :meth:`allreduce_grads` after ``backward()``
    and before ``optimizer.step()`` (or :meth:`begin` / :meth:`finish`).
    """

    name = "base"

    def __init__(self, params, topology: Topology, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 compression: str = "none", overlap: bool = False):
        self.params = [p for p in params if p.requires_grad]
        self.topo, self.comm = topology, topology.comm
        self.codec = compression_lib.get(compression)
        for p in self.params:
            self.codec.check_dtype(p.dtype)
        # Buckets hold grad / world_size: the gather copy multiplies for free, so no strategy
        # needs a scaling pass, and fp16 is pre-divided (no overflow) before anything is rounded.
        self.gather_scale = 1.0 / self.comm.Get_size()
        self._prepare(bucket_sizes(self.params, bucket_bytes))
        self.buckets = make_buckets(self.params, bucket_bytes, alloc=self._alloc)
        self._setup()
        self._bucket_of = {id(p): b.index for b in self.buckets for p in b.params}
        self._pending: dict[int, Pending] = {}
        self._seen = set()                       # ids of params whose grad is ready this round
        self._n_ready = [0] * len(self.buckets)
        self._hooks = []
        if overlap:
            self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                           for p in self.params]
        self.closed = False

    # --- what a strategy provides -------------------------------------------------------------
    def reduce_bucket(self, bucket: Bucket):
        """Generator: ``bucket.result <- sum over ranks`` of the gathered (pre-divided, so the
        sum is the mean) buffer; returns found_inf, the same on every rank.

        Yields lists of MPI requests it waits on; must not touch ``p.grad``.
        """
        raise NotImplementedError

    def _prepare(self, sizes) -> None:
        """Called with ``[(n_elems, dtype)]`` of every bucket before any is allocated."""

    def _alloc(self, n_elems: int, dtype, index: int) -> torch.Tensor:
        return torch.zeros(n_elems, dtype=dtype)

    def _setup(self) -> None:
        """Called once the buckets exist (per-bucket communicators, scratch buffers)."""

    def _free(self) -> None:
        """Release what :meth:`_prepare`/:meth:`_setup` created (collective)."""

    def handles(self) -> list:
        """Every MPI communicator/window this object owns (all null after :meth:`close`)."""
        return []

    # --- the round ----------------------------------------------------------------------------
    @property
    def started(self) -> list[int]:
        """Indices of the buckets started in the current round (by hooks or :meth:`begin`)."""
        return sorted(self._pending)

    def _start(self, bucket: Bucket) -> None:
        bucket.gather_grads(self.gather_scale)
        self._pending[bucket.index] = Pending(self.reduce_bucket(bucket))

    def _on_grad_ready(self, p) -> None:
        """Post-accumulate-grad hook: start a bucket once all its gradients are in; poll others."""
        i = self._bucket_of[id(p)]
        if i not in self._pending and id(p) not in self._seen:
            self._seen.add(id(p))
            self._n_ready[i] += 1
            if self._n_ready[i] == len(self.buckets[i].params):
                self._start(self.buckets[i])
        self.poll()

    def poll(self) -> bool:
        """Progress every bucket in flight without blocking; True when none is still running."""
        return all([pending.poll() for pending in self._pending.values()])

    def begin(self) -> None:
        """Start every bucket not started yet (non-blocking)."""
        if self.closed:
            raise RuntimeError("GradSync used after close()")
        for bucket in self.buckets:
            if bucket.index not in self._pending:
                self._start(bucket)

    def finish(self, scatter: bool = True) -> bool:
        """Wait for every bucket; with ``scatter`` write the means into ``p.grad``.

        Returns the overflow flag: True if any mean holds inf/NaN, identical on every rank.
        The means stay readable in ``bucket.result`` until the next round starts.
        """
        self.begin()
        found_inf = False
        for bucket in self.buckets:
            found_inf |= bool(self._pending.pop(bucket.index).wait())
            if scatter:
                bucket.scatter_grads()
        self._seen.clear()
        self._n_ready = [0] * len(self.buckets)
        return found_inf

    def allreduce_grads(self) -> bool:
        """Replace every parameter's gradient by its mean over ranks; returns found_inf."""
        self.begin()
        return self.finish(scatter=True)

    def close(self) -> None:
        """Finish a round in flight, remove hooks, free communicators/windows (collective)."""
        if self.closed:
            return
        for pending in self._pending.values():
            pending.wait()
        self._pending.clear()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._free()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A zero-copy NumPy view of a contiguous CPU tensor (what MPI sends)."""
    return t.detach().numpy()
