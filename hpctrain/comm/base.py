"""Gradient synchronisation: the interface every strategy implements, and its round protocol.

A strategy provides :meth:`GradSync.reduce_bucket`, a generator that turns ``bucket.flat`` (this
rank's gradients) into ``bucket.out`` (their mean over ranks, out of place) and returns the
overflow flag (see :mod:`hpctrain.comm.progress` for why a generator). Everything else lives
here once: the buckets (:mod:`hpctrain.comm.buckets`: fusion in reverse order of use, the
gradients' home in them), the overlap hooks, the ``begin``/``finish`` split (ChainerMN keeps
the MPI plumbing in its base communicator the same way). Buffers are allocated once at
construction; the hot path allocates nothing.

Round protocol: ``begin()`` starts every bucket not started yet; ``finish()`` waits for all and
optionally binds the means to ``p.grad``; ``allreduce_grads()`` is the two in a row. With
``overlap=True`` a post-accumulate-grad hook starts a bucket during backward as soon as all its
parameters have their gradient, and every hook call polls the buckets in flight.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from hpctrain.comm import compression as compression_lib
from hpctrain.comm import staging as staging_lib
from hpctrain.comm import streams, tuner
from hpctrain.comm.buckets import DEFAULT_BUCKET_BYTES, Bucket, bucket_sizes, make_buckets
from hpctrain.comm.progress import Pending, Reduction, TimedPending
from hpctrain.comm.wire import Wire
from hpctrain.ops.budget import NULL_PROBE
from hpctrain.topology import Topology


class GradSync:
    """Averages the gradients of ``params`` over ``topology.comm`` (the mean, as SSGD needs).

    Subclasses override :meth:`reduce_bucket`, and :meth:`_alloc`/:meth:`_setup`/:meth:`_free`
    when they own memory or communicators. Call :meth:`allreduce_grads` after ``backward()``
    and before ``optimizer.step()`` (or :meth:`begin` / :meth:`finish`).
    """

    name = "base"
    chosen_by = ""      # what chose this strategy (set by comm.auto), for describe()

    def __init__(self, params, topology: Topology, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 compression: str = "none", overlap: bool = False, tune: str = "static",
                 compression_options: dict | None = None):
        self.params = [p for p in params if p.requires_grad]
        self.topo, self.comm = topology, topology.comm
        self.codec = compression_lib.get(compression, **(compression_options or {}))
        for p in self.params:
            self.codec.check_dtype(p.dtype)
        # The mean, not the sum: a full-precision reduction folds 1/world_size into its last add;
        # fp16 is pre-divided when packed (no overflow) before anything is rounded.
        self.gather_scale = 1.0 / self.comm.Get_size()
        self.overlap = bool(overlap)
        self.tune = tuner.check_tune(tune)      # per-bucket MPI-or-ring: fixed rule or measured
        self.measured: dict[int, str] = {}      # bucket bytes -> method, where tune measured it
        self._prepare(bucket_sizes(self.params, bucket_bytes))
        # Device buffers may go to a CUDA-aware MPI as they are only where MPI sums the bucket's
        # own buffers: full precision, and no host memory of the strategy's own (a window). One
        # rank compresses nothing (compression.wire_codec) and sends nothing: never staged.
        one_rank = self.comm.Get_size() == 1
        direct_ok = (one_rank or not self.codec.compresses) and type(self)._alloc is GradSync._alloc
        self._stand_ins = staging_lib.forced()    # CPU buckets take the device paths (tests)
        self.buckets = make_buckets(self.params, bucket_bytes, alloc=self._alloc, direct_ok=direct_ok,
                                    one_rank=one_rank, wire=self._wire)
        self._setup()
        self._bucket_of = {id(p): b.index for b in self.buckets for p in b.params}
        self._pending: dict[int, Pending] = {}
        self.blocking_round = False     # finish() starts the whole round and waits at once
        # callbacks f(bucket_index) when a bucket starts (emulated link delay)
        self.on_start: list[Callable[[int], None]] = []
        self._seen: set[int] = set()             # ids of params whose grad is ready this round
        self._n_ready = [0] * len(self.buckets)
        self._index_in_bucket = {id(p): i for b in self.buckets for i, p in enumerate(b.params)}
        # Before autograd accumulates: a parameter whose bucket is in flight gets a private grad;
        # hooked only while a bucket may be in flight across a backward (not in a blocking round).
        self._guards = [[self._before_accumulate(p) for p in b.params] for b in self.buckets]
        self._guard_handles: dict[int, list] = {}
        self._hooks: list = []
        if overlap:
            self._hooks += [p.register_post_accumulate_grad_hook(self._on_grad_ready)
                            for p in self.params]
        self.probe = NULL_PROBE         # a PhaseBudget where a benchmark asks where time goes
        self.closed = False

    # --- what a strategy provides -------------------------------------------------------------
    def reduce_bucket(self, bucket: Bucket) -> Reduction:
        """Generator: ``bucket.out <- mean over ranks`` of ``bucket.flat`` (full precision:
        scale by ``gather_scale`` in the reduction), or of the packed, pre-divided
        ``bucket.packed`` (a whole-bucket wire: leave the mean there, in place; the bucket decodes
        it when read); returns found_inf, the same on every rank. Must not write
        ``bucket.flat`` (out of place), nor any bucket field: the wire's codec
        (``bucket.codec``, ``bucket.wire``) does the format work.

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
        direct = [b for b in self.buckets if b.staging is None and b.bufs[0].device.type != "cpu"]
        if direct and self.comm.Get_size() == 1:
            where += f", {len(direct)} kept on {direct[0].bufs[0].device} (one rank: no copies)"
        elif direct:    # a CUDA-aware MPI reads these buffers where they are
            where += f", {len(direct)} handed to MPI on {direct[0].bufs[0].device}"
        tuned = f", {len(self.measured)} size(s) measured" if self.measured else ""
        return (f"{self.name}{chosen}, compression={self.codec.name}, overlap={self.overlap}{tuned}, "
                f"{len(self.buckets)} bucket(s) of {mib:.1f} MiB in all ({how or 'none'}); "
                f"gradients live in the buckets{where}")

    def _methods(self) -> list[str]:
        """How each bucket is summed (for :meth:`describe`)."""
        return []

    def budget_level(self) -> str:
        """The budget phase a bucket's reduction is charged to where it says nothing finer."""
        return "reduce.node" if self.topo.n_nodes == 1 else "reduce.inter"

    def _prepare(self, sizes) -> None:
        """Called with ``[(n_elems, dtype)]`` of every bucket before any is allocated."""

    def _alloc(self, n_elems: int, dtype, index: int, which: int, pinned: bool = False) -> torch.Tensor:
        return torch.zeros(n_elems, dtype=dtype, pin_memory=pinned)

    def _wire(self, index: int, n_elems: int, dtype) -> Wire:
        """Bucket ``index``'s wire (:func:`make_buckets` asks while making it): by default the
        whole bucket among all ranks, compressed where its size makes that worth it."""
        return Wire.sized(self.codec, n_elems, dtype, self.comm.Get_size(), whole=True)

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
        self._launch(bucket, self._queue_input(bucket))

    def _queue_input(self, bucket: Bucket):
        """Begin a bucket's round: its input gathered, and for a device bucket the copy to the
        host queued (staged) or an event on the compute stream recorded (direct). Returns what
        the reduction waits on first (None: nothing)."""
        for callback in self.on_start:
            callback(bucket.index)
        bucket.next_round()
        with self.probe.span("pack", bucket.index):
            bucket.gather_grads(self.gather_scale)
            if bucket.staging is not None:
                return bucket.stage_in(self.gather_scale)
        device_like = bucket.flat.device.type != "cpu" or self._stand_ins
        if device_like and self.comm.Get_size() > 1:
            return staging_lib.produced(bucket.flat)    # direct: MPI reads what backward wrote
        # One rank: the "reduction" (a scale and a check) is queued on the compute stream after
        # backward, so stream order is all it needs: no event, and no host wait in a blocking round.
        return None

    def _launch(self, bucket: Bucket, ready) -> None:
        """Start the reduction once ``ready`` (:meth:`_queue_input`) has completed; a blocking
        round waits for it here, so blocking collectives start in bucket order everywhere."""
        if not self.blocking_round:
            self._guard_handles[bucket.index] = [p.register_hook(guard) for p, guard in
                                                 zip(bucket.params, self._guards[bucket.index])]
        reduction = self.reduce_bucket(bucket)
        if ready is not None:
            reduction = staging_lib.after(ready, reduction, wait=self.blocking_round)
        self._pending[bucket.index] = (Pending(reduction) if self.probe is NULL_PROBE else
                                       TimedPending(reduction, self.probe, bucket.index, self.budget_level()))

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
        """Start every bucket not started yet (non-blocking).

        Every bucket's input is queued (device-to-host copies on their side streams) before the
        first reduction starts: a blocking round runs each reduction to its end as it starts,
        and bucket k+1's copy then crosses PCIe while bucket k is reduced."""
        if self.closed:
            raise RuntimeError("GradSync used after close()")
        todo = [b for b in self.buckets if b.index not in self._pending]
        readies = [self._queue_input(b) for b in todo]
        for bucket, ready in zip(todo, readies):
            self._launch(bucket, ready)

    def finish(self, scatter: bool = True, check: bool = True) -> bool:
        """Wait for every bucket; with ``scatter`` bind each ``p.grad`` to its mean (a view).

        Returns the overflow flag: True if any mean holds inf/NaN, identical on every rank.
        Buckets in device memory keep their flags on the device; they are read here, once for
        the round (:func:`hpctrain.comm.streams.any_flag`), never per bucket; ``check=False``
        (a caller with no use for the flag) reads none and returns False.
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
        flags = []      # host bools, or device flags (device buckets) read once below
        for bucket in self.buckets:
            flags.append(self._pending.pop(bucket.index).wait())
            self._unguard(bucket.index)
            if scatter:
                with self.probe.span("unpack", bucket.index):
                    bucket.scatter_grads()
        self._seen.clear()
        self._n_ready = [0] * len(self.buckets)
        return streams.any_flag(flags) if check else False

    def _unguard(self, index: int) -> None:     # bucket ``index`` is no longer in flight
        for h in self._guard_handles.pop(index, ()):
            h.remove()

    def scatter_means(self) -> None:
        """After ``finish(scatter=False)``: bind each ``p.grad`` to its mean, as ``finish`` would."""
        for bucket in self.buckets:
            with self.probe.span("unpack", bucket.index):
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
        for index in list(self._guard_handles):
            self._unguard(index)
        for h in self._hooks:
            h.remove()
        self._hooks = []
        # Copies still in flight read or write the host buffers: every bucket's are complete
        # before any memory is unregistered (the registry is shared) or freed.
        for bucket in self.buckets:
            if bucket.staging is not None:
                bucket.staging.drain()
        for bucket in self.buckets:
            bucket.release()
        self._free()
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
