"""A DDP communication hook that averages DDP's buckets with hpctrain's strategies and codecs.

``ddp_model.register_comm_hook(state, allreduce_hook)`` with ``state = HookState(model, ...)``
(or :func:`register`). DDP hands the hook each gradient bucket as it fills during backward, in
the same order on every rank, and expects a ``torch.futures.Future`` holding the bucket's mean.

Each DDP bucket gets its own :class:`hpctrain.comm.GradSync` over one stand-in parameter the size
of the bucket (an expanded scalar: it holds no memory), built the first time a bucket of that
index, size, dtype and device is seen and reused every step after, so buffers, shared-memory
windows and communicators are allocated once. The hook binds DDP's flat buffer as the stand-in's
gradient and starts the sync's round (``begin``: the gradients are copied - or packed to fp16 -
into hpctrain's buffers at once, then reduced without blocking); the model's own gradient hooks
poll the rounds in flight while backward goes on, and the hook of DDP's last bucket waits for
all of them and completes the futures with the means (DDP copies them into the gradients).

DDP rebuilds its buckets after the first iteration (in the order gradients became ready): a
sync not used in an iteration is closed at that iteration's end, which every rank reaches with
the same buckets, so the collective frees line up. ``no_sync()`` calls no hook at all;
``static_graph`` and ``gradient_as_bucket_view`` change nothing here (DDP copies the result
into its views either way).
"""
import hashlib
import sys

import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.ddp import process_group as pg
from hpctrain.errors import UserError
from hpctrain.topology import Topology, emulated_ranks_per_node

UNSUMMABLE = (torch.float16, torch.bfloat16)


class HookStateError(UserError, ValueError):
    """A bad argument or a model that differs between ranks (one line)."""


def _params(model) -> list:
    if model is None:
        return []
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    params = model.parameters() if isinstance(model, torch.nn.Module) else model
    return [p for p in params if p.requires_grad]


class HookState:
    """``HookState(model, strategy="auto", compression="none")``: the ``state`` of
    :func:`allreduce_hook`.

    ``model`` (a module, a DDP model or parameters; optional) lets the state check up front that
    every rank holds the same parameter shapes and dtypes and that the codec takes them, and
    poll reductions in flight from the parameters' gradient hooks. ``strategy``: a name of
    :data:`hpctrain.comm.STRATEGIES` (``auto``: ``hierarchical`` where a node holds several
    ranks); ``compression``: ``none`` or ``fp16``; ``tune``: ``measure`` (each bucket's
    algorithm timed when its sync is built) or ``static``. ``topology`` defaults to
    :func:`hpctrain.ddp.init_process_group`'s, else one built on ``MPI.COMM_WORLD``.
    :meth:`close` (collective) frees what it holds; ``hpctrain.ddp.destroy_process_group``
    closes it too.
    """

    def __init__(self, model=None, *, strategy: str = "auto", compression: str = "none",
                 topology: Topology | None = None, tune: str = "measure", quiet: bool = False):
        for reg, name in ((comm_lib.STRATEGIES, strategy), (comm_lib.COMPRESSIONS, compression)):
            try:
                reg.get(name)
            except ValueError as exc:       # the registry's line, naming the choices
                raise HookStateError(f"hpctrain.ddp: {exc}") from None
        self.strategy, self.compression, self.tune, self.quiet = strategy, compression, tune, quiet
        self._own_topo = topology is None and pg.topology() is None
        if self._own_topo:
            topology = Topology.create(MPI.COMM_WORLD.Dup(), emulated_ranks_per_node())
        topo = topology or pg.topology()
        assert topo is not None             # made above where neither was given
        self.topo: Topology = topo
        params = _params(model)
        try:
            self._check(params)
        except BaseException:
            self._free_topology()
            raise
        self._grad_syncs: dict[tuple, comm_lib.GradSync] = {}    # (index, numel, dtype, device type)
        self._inflight: list[tuple[comm_lib.GradSync, torch.futures.Future]] = []
        self._used: set[tuple] = set()
        self._polls = [p.register_post_accumulate_grad_hook(self._poll) for p in params]
        self.steps = 0              # iterations whose buckets were all reduced
        self.closed = False
        if topology is pg.topology():
            pg.track(self)

    def _check(self, params) -> None:
        """Collective: same parameter layout on every rank; dtypes the codec and MPI can sum.
        Every rank raises the same one line, naming the ranks at fault."""
        comm = self.topo.comm
        problem = None
        for p in params:
            if p.dtype in UNSUMMABLE:
                problem = (f"a parameter of shape {tuple(p.shape)} is {p.dtype}: the hook reduces "
                           "float32/float64 gradients (keep fp32 parameters under torch.autocast, or "
                           "use DDP's default allreduce)")
            else:
                try:
                    comm_lib.compression.get(self.compression).check_dtype(p.dtype)
                except ValueError as exc:
                    problem = str(exc)
            if problem:
                break
        layout = repr([(tuple(p.shape), str(p.dtype)) for p in params]).encode()
        seen = comm.allgather((problem, hashlib.sha1(layout).hexdigest()))
        bad = [r for r, (pr, _) in enumerate(seen) if pr]
        if bad:
            raise HookStateError(f"hpctrain.ddp: rank(s) {', '.join(map(str, bad))}: {seen[bad[0]][0]}")
        differ = [r for r, (_, d) in enumerate(seen) if d != seen[0][1]]
        if differ:
            raise HookStateError(f"hpctrain.ddp: rank(s) {', '.join(map(str, differ))} hold parameters "
                                 "of other shapes or dtypes than rank 0 (every rank must build the same model)")
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() != comm.Get_size():
            raise HookStateError(f"hpctrain.ddp: torch.distributed has {torch.distributed.get_world_size()} "
                                 f"ranks but the MPI communicator {comm.Get_size()}")

    # --- the hook's work ---------------------------------------------------------------------
    def _sync_for(self, key: tuple, buffer: torch.Tensor) -> comm_lib.GradSync:
        sync = self._grad_syncs.get(key)
        if sync is None:
            if buffer.dtype in UNSUMMABLE:
                raise HookStateError(f"hpctrain.ddp: DDP bucket {key[0]} is {buffer.dtype}: the hook "
                                     "reduces float32/float64 gradients")
            # An expanded scalar: the shape of the bucket without its memory.
            stand_in = torch.nn.Parameter(torch.zeros(1, dtype=buffer.dtype, device=buffer.device)
                                          .expand(buffer.numel()))
            sync = comm_lib.create(self.strategy, [stand_in], self.topo, compression=self.compression,
                                   overlap=True, tune=self.tune)
            if not self._grad_syncs and self.topo.rank == 0 and not self.quiet:
                sys.stderr.write(f"hpctrain.ddp: DDP buckets reduced by {sync.describe().split(', overlap=')[0]}\n")
            self._grad_syncs[key] = sync
        return sync

    def reduce(self, bucket) -> torch.futures.Future:
        """Start the mean of ``bucket.buffer()`` over ranks; the future completes at the last
        bucket of the iteration."""
        if self.closed:
            raise RuntimeError("hpctrain.ddp: HookState used after close()")
        buffer = bucket.buffer()
        key = (bucket.index(), buffer.numel(), buffer.dtype, buffer.device.type)
        sync = self._sync_for(key, buffer)
        stand_in = sync.params[0]
        stand_in.grad = buffer
        try:
            sync.begin()            # copies (or packs) the buffer: DDP may reuse it afterwards
        finally:
            stand_in.grad = None
        self._used.add(key)
        devices = [buffer.device] if buffer.device.type == "cuda" else None
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=devices)
        self._inflight.append((sync, fut))
        self._poll()
        if bucket.is_last():
            self._complete()
        return fut

    def _poll(self, *_) -> None:
        for sync, _fut in self._inflight:
            sync.poll()

    def _complete(self) -> None:
        """Wait for every bucket of this iteration, in order; hand DDP the means; close the syncs
        of buckets DDP no longer has (after its rebuild)."""
        inflight, self._inflight = self._inflight, []
        for sync, fut in inflight:
            sync.finish(scatter=False, check=False)     # DDP has no use for the overflow flag
            fut.set_result(sync.buckets[0].result)
        for key in [k for k in self._grad_syncs if k not in self._used]:
            self._grad_syncs.pop(key).close()
        self._used.clear()
        self.steps += 1

    def describe(self) -> str:
        """One line per DDP bucket: its size and how hpctrain reduces it."""
        return "\n".join(f"bucket {k[0]}: {k[1] * s.buckets[0].bufs[0].element_size() / 2**20:.1f} MiB "
                         f"{str(k[2]).replace('torch.', '')}, {s.describe().split(', overlap=')[0]}, "
                         f"{', '.join(s._methods())}"
                         for k, s in self._grad_syncs.items())

    def close(self) -> None:
        """Free every sync and, where the state built it, the topology (collective)."""
        if self.closed:
            return
        for h in self._polls:
            h.remove()
        self._polls = []
        for sync, _fut in self._inflight:        # an iteration cut short: finish it everywhere
            sync.finish(scatter=False)
        self._inflight = []
        for sync in self._grad_syncs.values():
            sync.close()
        self._grad_syncs.clear()
        self._free_topology()
        pg.untrack(self)
        self.closed = True

    def _free_topology(self) -> None:
        if self._own_topo:
            comm = self.topo.comm
            self.topo.close()
            comm.Free()
            self._own_topo = False


def allreduce_hook(state: HookState, bucket: torch.distributed.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the mean over ranks of ``bucket.buffer()``, by hpctrain (the
    annotations are evaluated: DDP checks them)."""
    return state.reduce(bucket)


def register(ddp_model, **options) -> HookState:
    """``register(ddp_model, strategy=..., compression=...)``: build a :class:`HookState` for
    ``ddp_model`` and register :func:`allreduce_hook` with it; returns the state."""
    state = HookState(ddp_model, **options)
    ddp_model.register_comm_hook(state, allreduce_hook)
    return state
