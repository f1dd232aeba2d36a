"""Gradient synchronisation: the interface every strategy implements, and the shared bucket code.

A strategy provides :meth:`GradSync.reduce_bucket`, a generator that turns ``bucket.flat`` (this
rank's gradients) into ``bucket.out`` (their mean over ranks, out of place) and returns the
overflow flag (see :mod:`hpctrain.comm.progress` for why a generator). Everything else lives
here once: fusion buckets in reverse order of use, the gradients' home in the buckets, the
overlap hooks, the ``begin``/``finish`` split (ChainerMN keeps the MPI plumbing in its base
communicator the same way). Buffers are allocated once at construction; the hot path allocates
nothing.

Gradients live in the buckets (DDP's ``gradient_as_bucket_view``). Each bucket has two buffers
that swap roles every round: round t reduces ``bufs[t % 2]`` (the input, ``flat``) into
``bufs[(t + 1) % 2]`` (``out``), and ``finish(scatter=True)`` makes every ``p.grad`` a view of
its slice of ``out``: no copy. The next backward accumulates into those views (autograd adds
into an existing ``.grad`` in place), which are exactly round t+1's input, so a step with the
default ``zero_grad(set_to_none=False)`` moves no gradient byte outside the collective. Because
the reduction is out of place, a rank's own gradients stay intact in ``flat`` until the next
round: ``finish(scatter=False)`` leaves ``p.grad`` holding them (the non-finite diagnosis and
OD-SGD need that), and :meth:`GradSync.scatter_means` rebinds afterwards. For ``hierarchical``
both buffers are this rank's memory in the shared window. Double buffering costs what the
copying design cost (gradients + one bucket copy), DDP's single-buffer view mode half that.

What breaks the views is handled where it is seen, at the start of a bucket (``gather``): a
``p.grad`` that is not the view of the round's input (``zero_grad(set_to_none=True)`` then a
backward that allocated a fresh tensor; an optimiser or user that assigned ``.grad``; a round
that did not scatter) is copied in - one copy, as before - and ``None`` counts as zeros; the
next scatter binds the views again. A second backward while a bucket is in flight: a tensor
hook that runs before autograd accumulates gives that parameter a private ``.grad``, a copy of
the round's input (its own gradient, which the out-of-place reduction never writes), so the new
gradient accumulates there and the buffers in flight are never touched. The new gradients are
*not* part of this round (a bucket is reduced once per round): ``finish(scatter=True)`` replaces
them with the round's means, ``finish(scatter=False)`` leaves g1 + g2 in ``p.grad`` for the next
round. Do not zero or assign ``.grad`` of a parameter whose bucket is in flight (OD-SGD keeps
private gradients for its steps overlapping a round). :meth:`close` gives every parameter a
private copy of its gradient before the buffers go.

Round protocol: ``begin()`` starts every bucket not started yet; ``finish()`` waits for all and
optionally binds the means to ``p.grad``; ``allreduce_grads()`` is the two in a row. With
``overlap=True`` a post-accumulate-grad hook starts a bucket during backward as soon as all its
parameters have their gradient, and every hook call polls the buckets in flight.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from hpctrain.comm import compression as compression_lib
from hpctrain.comm import staging as staging_lib
from hpctrain.comm import tuner
from hpctrain.comm.progress import Pending
from hpctrain.topology import Topology

DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass
class Bucket:
    """Parameters whose gradients travel together; two flat buffers that swap roles each round."""
    params: list            # torch.nn.Parameter, in bucket order
    offsets: list           # element offset of each parameter in a buffer
    bufs: list              # two 1-D buffers, dtype of the parameters
    index: int
    k: int = 1              # round t's input is bufs[k] (flipped when a round starts)
    wire: torch.Tensor = None     # compressed strategies: gradients are packed here instead of
    codec: object = None          # being read from ``flat``; the mean is left here, encoded,
    encoded: bool = False         # until read (``result``) or bound (``scatter``)
    views: list = field(default=None, repr=False)   # views[j][i]: params[i]'s slice of bufs[j]
    staging: object = None        # device buckets: the device buffers the views live in
                                  # (hpctrain.comm.staging); None: the views live in ``bufs``

    def __post_init__(self):
        homes = self.bufs if self.staging is None else self.staging.dev
        self.views = [[buf[off:off + p.numel()].view_as(p) for p, off in zip(self.params, self.offsets)]
                      for buf in homes]

    @property
    def flat(self) -> torch.Tensor:
        """This round's input: this rank's gradients (``p.grad`` views of it during backward)."""
        return self.bufs[self.k]

    @property
    def out(self) -> torch.Tensor:
        """Where this round's mean lands (treat as read-only)."""
        return self.bufs[1 - self.k]

    @property
    def n_elems(self) -> int:
        return self.bufs[0].numel()

    @property
    def result(self) -> torch.Tensor:
        """The mean over ranks after a round (decoded from the wire on first read; for a
        staged bucket, copied to its device buffer on first read - an encoded mean as fp16,
        decoded there - and returned from there)."""
        if self.staging is not None:
            wire, self.encoded = (self.wire if self.encoded else None), False
            return self.staging.to_device(self.out, self.staging.dev[1 - self.k], self.codec, wire)
        if self.encoded:
            self.codec.unpack(self.wire, [self.out])
            self.encoded = False
        return self.out

    def stage_in(self, scale: float) -> staging_lib.Ready:
        """Staged bucket, after :meth:`gather_grads`: queue the copy of this round's input from
        the device to the host buffer the strategy reduces; a compressed bucket packs
        ``scale`` times it into fp16 on the device first and only the wire crosses
        (:mod:`hpctrain.comm.staging`). Returns what the reduction must wait on."""
        st = self.staging
        if self.wire is None:
            return st.to_host(st.dev[self.k], self.flat)
        self.wire = st.host_wire(self.wire)
        return st.to_host(st.dev[self.k], self.flat, self.codec, self.wire, scale)

    def next_round(self) -> None:
        """Swap the buffers: the last round's ``out`` (where ``p.grad`` views point after a
        scatter) becomes this round's input."""
        self.k ^= 1
        self.encoded = False

    def gather_grads(self, scale: float = 1.0) -> None:
        """Make this round's input hold this rank's gradients (zeros where a grad is missing).

        A ``p.grad`` that already is its view of ``flat`` costs nothing; any other is copied.
        One that is its view of ``out`` (the last round did not bind means) moves into ``flat``
        and is rebound there, since ``out`` is about to receive the mean. A compressed bucket
        packs ``scale`` times the gradients straight into its wire buffer (pre-division before
        anything is rounded to fp16) instead of copying; a full-precision bucket leaves the
        scaling to the reduction, which folds it into its last add.
        """
        mine, theirs = self.views[self.k], self.views[1 - self.k]
        packed = self.wire is not None and self.staging is None    # staged: packed in stage_in
        srcs = []
        for i, (p, v) in enumerate(zip(self.params, mine)):
            g = p.grad
            if g is None:
                g = v.zero_()
            elif g is theirs[i]:
                v.copy_(g)
                p.grad = g = v
            elif g is not v and not packed:
                v.copy_(g)
            srcs.append(g)
        if packed:
            self.codec.pack([g.reshape(-1) for g in srcs], self.wire, scale)

    def scatter_grads(self) -> None:
        """Bind every ``p.grad`` to its view of the mean (decoding the wire into ``out`` first
        if the mean is still encoded: one pass, like the copy it replaces)."""
        self.result
        for p, v in zip(self.params, self.views[1 - self.k]):
            if p.grad is not v:
                p.grad = v

    def owns(self, p_index: int, grad) -> bool:
        """Is ``grad`` one of this bucket's views for ``params[p_index]``?"""
        return grad is not None and (grad is self.views[0][p_index] or grad is self.views[1][p_index])

    def release(self) -> None:
        """Give every parameter whose ``.grad`` is a view of these buffers a private copy."""
        for i, p in enumerate(self.params):
            if self.owns(i, p.grad):
                p.grad = p.grad.clone()
        if self.staging is not None:    # host memory unregistered before the strategy frees it
            self.staging.release()


def _groups(params, bucket_bytes: int) -> list[list]:
    """Parameters grouped into buckets of about ``bucket_bytes``, last-defined first."""
    buckets, cur, cur_bytes = [], [], 0
    for p in reversed(list(params)):
        n_bytes = p.numel() * p.element_size()
        if cur and (cur_bytes + n_bytes > bucket_bytes or p.dtype != cur[0].dtype
                    or p.device != cur[0].device):
            buckets.append(cur)
            cur, cur_bytes = [], 0
        cur.append(p)
        cur_bytes += n_bytes
    if cur:
        buckets.append(cur)
    return buckets


def make_buckets(params, bucket_bytes: int, alloc=None, direct_ok: bool = False) -> list[Bucket]:
    """Group parameters into buckets of about ``bucket_bytes``, last-used (last-defined) first.

    Backward produces gradients roughly in reverse definition order, so reversing lets the first
    bucket be complete earliest (PyTorch DDP and Horovod fuse the same way). Parameters of a
    different dtype or device start a new bucket. ``alloc(n_elems, dtype, index, which)``
    provides each bucket's two host buffers, the ones MPI reads (``which`` 0 and 1; default:
    fresh zeroed tensors; the hierarchical strategy hands out window memory); a staged bucket's
    are asked for with ``pinned=True`` where CUDA can use page-locked memory.

    This is the one place that decides where a bucket's gradients live
    (:func:`hpctrain.comm.staging.route`): a bucket of CPU parameters keeps them in its host
    buffers; any other bucket is staged (:mod:`hpctrain.comm.staging`): the gradients live in
    device buffers and cross to the host buffers around each reduction; host memory the CUDA
    driver did not allocate (a shared window) is registered with it until ``Bucket.release``.
    With ``direct_ok`` (the strategy lets MPI sum the bucket's own buffers) and an MPI library
    that takes device buffers (:func:`hpctrain.comm.staging.mpi_takes_device_buffers`) a device
    bucket's buffers are on the device and go to MPI as they are, with no staging.
    ``HPCTRAIN_TEST_STAGING=1`` routes CPU buckets like device ones (tests).
    """
    alloc = alloc or (lambda n, dtype, i, which, pinned=False: torch.zeros(n, dtype=dtype, pin_memory=pinned))
    force = staging_lib.forced()
    registry = staging_lib.HostRegistry(staging_lib.cuda_mpi.cudart())
    out = []
    for i, group in enumerate(_groups(params, bucket_bytes)):
        offsets = np.cumsum([0] + [p.numel() for p in group[:-1]]).tolist()
        n, dtype, device = sum(p.numel() for p in group), group[0].dtype, group[0].device
        direct = direct_ok and (force or device.type != "cpu") and staging_lib.mpi_takes_device_buffers(device)
        where = staging_lib.route(device.type, forced=force, direct=direct)
        staging = None
        if where == "direct":       # MPI reads the device buffers themselves: nothing to stage
            bufs = [torch.zeros(n, dtype=dtype, device=device) for _ in (0, 1)]
        elif where == "staged":
            staging = staging_lib.Staging(n, dtype, device, registry)
            pinned = staging_lib.pin_host()
            bufs = [alloc(n, dtype, i, which, pinned=True) if pinned else alloc(n, dtype, i, which)
                    for which in (0, 1)]
        else:
            bufs = [alloc(n, dtype, i, which) for which in (0, 1)]
        out.append(Bucket(params=group, offsets=offsets, bufs=bufs, index=i, staging=staging))
    registry.register([buf for b in out if b.staging is not None for buf in b.bufs])
    return out


def bucket_sizes(params, bucket_bytes: int) -> list[tuple[int, torch.dtype]]:
    """``(n_elems, dtype)`` of each bucket :func:`make_buckets` would build (allocates nothing)."""
    return [(sum(p.numel() for p in g), g[0].dtype) for g in _groups(params, bucket_bytes)]


class GradSync:
    """Averages the gradients of ``params`` over ``topology.comm`` (the mean, as SSGD needs).

    Subclasses override :meth:`reduce_bucket`, and :meth:`_alloc`/:meth:`_setup`/:meth:`_free`
    when they own memory or communicators. Call :meth:`allreduce_grads` after ``backward()``
    and before ``optimizer.step()`` (or :meth:`begin` / :meth:`finish`).
    """

    name = "base"

    def __init__(self, params, topology: Topology, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 compression: str = "none", overlap: bool = False, tune: str = "static"):
        self.params = [p for p in params if p.requires_grad]
        self.topo, self.comm = topology, topology.comm
        self.codec = compression_lib.get(compression)
        for p in self.params:
            self.codec.check_dtype(p.dtype)
        # The mean, not the sum: a full-precision reduction folds 1/world_size into its last add;
        # fp16 is pre-divided when packed (no overflow) before anything is rounded.
        self.gather_scale = 1.0 / self.comm.Get_size()
        self.overlap = bool(overlap)
        self.tune = tuner.check_tune(tune)      # per-bucket MPI-or-ring: fixed rule or measured
        self.measured = {}                      # bucket bytes -> method, where tune measured it
        self._prepare(bucket_sizes(self.params, bucket_bytes))
        # Device buffers may go to a CUDA-aware MPI as they are only where MPI sums the bucket's
        # own buffers: full precision, and no host memory of the strategy's own (a window).
        direct_ok = not self.codec.compresses and type(self)._alloc is GradSync._alloc
        self.buckets = make_buckets(self.params, bucket_bytes, alloc=self._alloc, direct_ok=direct_ok)
        self._setup()
        self._bucket_of = {id(p): b.index for b in self.buckets for p in b.params}
        self._pending: dict[int, Pending] = {}
        self.blocking_round = False     # finish() starts the whole round and waits at once
        self.on_start = []      # callbacks f(bucket_index) when a bucket starts (emulated link delay)
        self._seen = set()                       # ids of params whose grad is ready this round
        self._n_ready = [0] * len(self.buckets)
        self._index_in_bucket = {id(p): i for b in self.buckets for i, p in enumerate(b.params)}
        # Before autograd accumulates: a parameter whose bucket is in flight gets a private grad.
        self._hooks = [p.register_hook(self._before_accumulate(p)) for p in self.params]
        if overlap:
            self._hooks += [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                            for p in self.params]
        self.closed = False

    # --- what a strategy provides -------------------------------------------------------------
    def reduce_bucket(self, bucket: Bucket):
        """Generator: ``bucket.out <- mean over ranks`` of ``bucket.flat`` (full precision:
        scale by ``gather_scale`` in the reduction), or of the packed, pre-divided ``wire``
        (compressed: leave the mean in ``wire`` and set ``bucket.encoded``); returns found_inf,
        the same on every rank. Must not write ``bucket.flat`` (out of place).

        Yields lists of MPI requests it waits on; must not touch ``p.grad``.
        """
        raise NotImplementedError

    def describe(self) -> str:
        """One line: the strategy, what chose it, codec, overlap, buckets and their algorithms."""
        methods = self._methods()
        counts = {m: methods.count(m) for m in dict.fromkeys(methods)}
        how = ", ".join(f"{n} {m}" for m, n in counts.items())
        mib = sum(b.n_elems * b.bufs[0].element_size() for b in self.buckets) / 2**20
        chosen = f" ({self.chosen_by})" if getattr(self, "chosen_by", "") else ""
        staged = [b.staging for b in self.buckets if b.staging is not None]
        where = f", {len(staged)} staged from {staged[0].describe()}" if staged else ""
        tuned = f", {len(self.measured)} size(s) measured" if self.measured else ""
        return (f"{self.name}{chosen}, compression={self.codec.name}, overlap={self.overlap}{tuned}, "
                f"{len(self.buckets)} bucket(s) of {mib:.1f} MiB in all ({how or 'none'}); "
                f"gradients live in the buckets{where}")

    def _methods(self) -> list[str]:
        """How each bucket is summed (for :meth:`describe`)."""
        return []

    def _prepare(self, sizes) -> None:
        """Called with ``[(n_elems, dtype)]`` of every bucket before any is allocated."""

    def _alloc(self, n_elems: int, dtype, index: int, which: int, pinned: bool = False) -> torch.Tensor:
        return torch.zeros(n_elems, dtype=dtype, pin_memory=pinned)

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
        for callback in self.on_start:
            callback(bucket.index)
        bucket.next_round()
        bucket.gather_grads(self.gather_scale)
        reduction = self.reduce_bucket(bucket)
        if bucket.staging is not None:  # starts once the copy to the host is done; a blocking
            # round waits for it here, so blocking collectives start in bucket order everywhere
            reduction = staging_lib.after(bucket.stage_in(self.gather_scale), reduction,
                                          wait=self.blocking_round)
        elif bucket.flat.device.type != "cpu":  # direct: MPI reads device memory backward wrote
            reduction = staging_lib.after(staging_lib.produced(bucket.flat), reduction,
                                          wait=self.blocking_round)
        self._pending[bucket.index] = Pending(reduction)

    def _before_accumulate(self, p):
        """Tensor hook of ``p``: runs before autograd adds a new gradient into ``p.grad``."""
        i, j = self._bucket_of[id(p)], self._index_in_bucket[id(p)]

        def hook(grad):
            if i in self._pending:
                bucket = self.buckets[i]
                if bucket.owns(j, p.grad):   # in flight: p.grad is the round's input (gather
                    p.grad = p.grad.clone()  # saw to it), never written: g1 + g2 go private
            return None
        return hook

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

    def poll_reduction(self) -> bool:
        """:meth:`poll` of the reduction itself (a wrapper that adds latency overrides ``poll``
        only), for a caller that waits politely and sleeps any emulated remainder later."""
        return GradSync.poll(self)

    def begin(self) -> None:
        """Start every bucket not started yet (non-blocking)."""
        if self.closed:
            raise RuntimeError("GradSync used after close()")
        for bucket in self.buckets:
            if bucket.index not in self._pending:
                self._start(bucket)

    def finish(self, scatter: bool = True) -> bool:
        """Wait for every bucket; with ``scatter`` bind each ``p.grad`` to its mean (a view).

        Returns the overflow flag: True if any mean holds inf/NaN, identical on every rank.
        The means stay readable in ``bucket.result`` until the next round starts; without
        ``scatter``, ``p.grad`` keeps this rank's own gradients (:meth:`scatter_means` later).

        A round that nothing started before (no overlap hooks, no :meth:`begin`) is started
        here with ``blocking_round`` set: a strategy may then use blocking collectives, since
        every rank starts every bucket here, in the same order (``flat`` does).
        """
        self.blocking_round = not self.overlap and not self._pending
        try:
            self.begin()
        finally:
            self.blocking_round = False
        found_inf = False
        for bucket in self.buckets:
            found_inf |= bool(self._pending.pop(bucket.index).wait())
            if scatter:
                bucket.scatter_grads()
        self._seen.clear()
        self._n_ready = [0] * len(self.buckets)
        return found_inf

    def scatter_means(self) -> None:
        """After ``finish(scatter=False)``: bind each ``p.grad`` to its mean, as ``finish`` would."""
        for bucket in self.buckets:
            bucket.scatter_grads()

    def allreduce_grads(self) -> bool:
        """Replace every parameter's gradient by its mean over ranks; returns found_inf."""
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
        for bucket in self.buckets:
            bucket.release()
        self._free()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
