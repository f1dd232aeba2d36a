"""Fusion buckets: where a rank's gradients live, and how they get in and out.

Gradients live in the buckets (DDP's ``gradient_as_bucket_view``). Each bucket has two buffers
that swap roles every round: round t reduces ``bufs[t % 2]`` (the input, ``flat``) into
``bufs[(t + 1) % 2]`` (``out``), and ``finish(scatter=True)`` makes every ``p.grad`` a view of
its slice of ``out``: no copy. The next backward accumulates into those views (autograd adds
into an existing ``.grad`` in place), which are exactly round t+1's input, so a step with the
default ``zero_grad(set_to_none=False)`` moves no gradient byte outside the collective. Because
the reduction is out of place, a rank's own gradients stay intact in ``flat`` until the next
round: ``finish(scatter=False)`` leaves ``p.grad`` holding them (the non-finite diagnosis and
OD-SGD need that), and :meth:`hpctrain.comm.base.GradSync.scatter_means` rebinds afterwards. For
``hierarchical`` both buffers are this rank's memory in the shared window. Double buffering
costs what the copying design cost (gradients + one bucket copy), DDP's single-buffer view mode
half that.

What breaks the views is handled where it is seen, at the start of a bucket (``gather``): a
``p.grad`` that is not the view of the round's input (``zero_grad(set_to_none=True)`` then a
backward that allocated a fresh tensor; an optimiser or user that assigned ``.grad``; a round
that did not scatter) is copied in - one copy, as before - and ``None`` counts as zeros; the
next scatter binds the views again. A second backward while a bucket is in flight: a tensor hook
that runs before autograd accumulates gives that parameter a private ``.grad``, a copy of the
round's input (its own gradient, which the out-of-place reduction never writes), so the new
gradient accumulates there and the buffers in flight are never touched. The new gradients are
*not* part of this round (a bucket is reduced once per round): ``finish(scatter=True)`` replaces
them with the round's means, ``finish(scatter=False)`` leaves g1 + g2 in ``p.grad`` for the next
round. Do not zero or assign ``.grad`` of a parameter whose bucket is in flight (OD-SGD keeps
private gradients for its steps overlapping a round). :meth:`hpctrain.comm.base.GradSync.close`
gives every parameter a private copy of its gradient before the buffers go.

Where a bucket's memory lives (host, pinned host staging, or the device for a CUDA-aware MPI) is
decided once, in :func:`make_buckets`; a strategy only supplies the allocator.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from hpctrain.comm import staging as staging_lib
from hpctrain.comm.compression import Codec
from hpctrain.comm.wire import Wire
from hpctrain.kernels._args import is_dense

DEFAULT_BUCKET_BYTES = 25 * 2**20


@dataclass
class Bucket:
    """Parameters whose gradients travel together; two flat buffers that swap roles each round."""
    params: list            # torch.nn.Parameter, in bucket order
    offsets: list           # element offset of each parameter in a buffer
    bufs: list              # two 1-D buffers, dtype of the parameters
    index: int
    k: int = 1              # round t's input is bufs[k] (flipped when a round starts)
    wire: Wire = field(default_factory=Wire)    # what crosses between ranks (hpctrain.comm.wire),
                            # made with the bucket and never replaced; Wire(): full precision, no buffer
    views: list = field(default_factory=list, repr=False)   # views[j][i]: params[i]'s slice of bufs[j]
    staging: staging_lib.Staging | None = None   # device buckets: the device buffers the views
                            # live in (hpctrain.comm.staging); None: the views live in ``bufs``
    _encoded: bool = field(default=False, init=False, repr=False)  # the mean is still in
                            # ``packed`` (read: ``result``; bound: ``scatter``)

    def __post_init__(self):
        homes = self.bufs if self.staging is None else self.staging.dev
        self.views = [[grad_view(buf, off, p) for p, off in zip(self.params, self.offsets)]
                      for buf in homes]

    def segment(self, j: int, i: int) -> torch.Tensor:
        """``params[i]``'s slice of buffer set ``j`` as 1-D memory (memory order, whatever the
        parameter's strides): what a packer reads."""
        homes = self.bufs if self.staging is None else self.staging.dev
        return homes[j][self.offsets[i]:self.offsets[i] + self.params[i].numel()]

    @property
    def packed(self) -> torch.Tensor | None:
        """The whole bucket packed into its wire's buffer, as it travels (None: ``flat``/``out``
        travel themselves). Read-only: the wire belongs to the bucket."""
        return self.wire.buf if self.wire.packs_bucket else None

    @property
    def codec(self) -> Codec:
        """The codec of this bucket's wire (read-only)."""
        return self.wire.codec

    @property
    def flat(self) -> torch.Tensor:
        """This round's input: this rank's gradients (``p.grad`` views of it during backward)."""
        return self.bufs[self.k]

    @property
    def out(self) -> torch.Tensor:
        """Where this round's mean lands (treat as read-only)."""
        return self.bufs[1 - self.k]

    @property
    def single(self) -> bool:
        """One buffer in both roles (a direct bucket at one rank: the mean is the input)."""
        return self.bufs[0] is self.bufs[1]

    @property
    def n_elems(self) -> int:
        return self.bufs[0].numel()

    @property
    def result(self) -> torch.Tensor:
        """The mean over ranks after a round (decoded from the wire on first read; for a
        staged bucket, copied to its device buffer on first read - an encoded mean as fp16,
        decoded there - and returned from there)."""
        if self.staging is not None:
            encoded, self._encoded = (self.wire if self._encoded else None), False
            return self.staging.to_device(self.out, self.staging.dev[1 - self.k], encoded)
        if self._encoded:
            self.wire.unpack([self.out])
            self._encoded = False
        return self.out

    def stage_in(self, scale: float) -> staging_lib.Ready:
        """Staged bucket, after :meth:`gather_grads`: queue the copy of this round's input from
        the device to the host buffer the strategy reduces; a compressed bucket packs
        ``scale`` times it into fp16 on the device first and only the wire crosses
        (:mod:`hpctrain.comm.staging`). Returns what the reduction must wait on."""
        st = self.staging
        assert st is not None
        if not self.wire.packs_bucket:
            return st.to_host(st.dev[self.k], self.flat)
        self._encoded = True        # the round's values (then the mean) are in the wire
        return st.to_host(st.dev[self.k], self.flat, self.wire, scale)

    def next_round(self) -> None:
        """Swap the buffers: the last round's ``out`` (where ``p.grad`` views point after a
        scatter) becomes this round's input."""
        self.k ^= 1
        self._encoded = False

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
        pack_here = self.wire.packs_bucket and self.staging is None    # staged: packed in stage_in
        srcs = []
        for i, (p, v) in enumerate(zip(self.params, mine)):
            g = p.grad
            if g is None:
                g = v.zero_()
            elif g is theirs[i]:
                if not self.single:
                    v.copy_(g)
                p.grad = g = v
            elif g is not v and (not pack_here or not (g.is_contiguous() and v.is_contiguous())):
                v.copy_(g)      # packed: a strided view is packed in memory order, from v
                g = v
            if pack_here:       # the packer's inputs (nothing else reads them)
                srcs.append(self.segment(self.k, i) if g is v else g.reshape(-1))
        if pack_here:       # the round's values (then the mean, in place) are in the wire
            self.wire.pack(srcs, scale)
            self._encoded = True

    def scatter_grads(self) -> None:
        """Bind every ``p.grad`` to its view of the mean (decoding the wire into ``out`` first
        if the mean is still encoded: one pass, like the copy it replaces)."""
        self.result  # noqa: B018 (the property waits for the round and decodes the mean)
        for p, v in zip(self.params, self.views[1 - self.k]):
            if p.grad is not v:
                p.grad = v

    def owns(self, p_index: int, grad) -> bool:
        """Is ``grad`` one of this bucket's views for ``params[p_index]``?"""
        return grad is not None and (grad is self.views[0][p_index] or grad is self.views[1][p_index])

    def forget_buffers(self) -> None:
        """Drop every reference into ``bufs`` (the strategy is about to unmap their memory);
        call after :meth:`release`."""
        self.bufs = [torch.empty(0, dtype=self.bufs[0].dtype)] * 2
        self.views = []

    def release(self) -> None:
        """Give every parameter whose ``.grad`` is a view of these buffers a private copy."""
        for i, p in enumerate(self.params):
            if self.owns(i, p.grad):
                p.grad = p.grad.clone()
        if self.staging is not None:    # host memory unregistered before the strategy frees it
            self.staging.release()


def grad_view(buf: torch.Tensor, offset: int, p: torch.Tensor) -> torch.Tensor:
    """``p``'s gradient as a view of ``buf[offset:offset + p.numel()]`` with ``p``'s own strides
    where ``p`` is densely laid out in another order (channels_last), as DDP's
    ``gradient_as_bucket_view`` does: autograd then accumulates a channels_last gradient into
    a channels_last view (no layout conversion each step), and the LARS kernel and torch's
    ``_foreach`` fast path see weight and gradient laid out alike. Contiguous
    and non-dense parameters get a contiguous view."""
    seg = buf[offset:offset + p.numel()]
    if p.is_contiguous() or not is_dense(p):
        return seg.view_as(p)
    return seg.as_strided(p.shape, p.stride())


def _groups(params, bucket_bytes: int) -> list[list]:
    """Parameters grouped into buckets of about ``bucket_bytes``, last-defined first."""
    buckets: list[list] = []
    cur: list = []
    cur_bytes = 0
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


def make_buckets(params, bucket_bytes: int, alloc=None, direct_ok: bool = False,
                 one_rank: bool = False, wire=None) -> list[Bucket]:
    """Group parameters into buckets of about ``bucket_bytes``, last-used (last-defined) first.

    Backward produces gradients roughly in reverse definition order, so reversing lets the first
    bucket be complete earliest (PyTorch DDP and Horovod fuse the same way). Parameters of a
    different dtype or device start a new bucket. ``alloc(n_elems, dtype, index, which)``
    provides each bucket's two host buffers, the ones MPI reads (``which`` 0 and 1; default:
    fresh zeroed tensors; the hierarchical strategy hands out window memory); a staged bucket's
    are asked for with ``pinned=True`` where CUDA can use page-locked memory.
    ``wire(index, n_elems, dtype)`` gives each bucket its one :class:`~hpctrain.comm.wire.Wire`
    (default: full precision, nothing to pack); a staged bucket's whole wire is staged with it.

    This is the one place that decides where a bucket's gradients live
    (:func:`hpctrain.comm.staging.route`): a bucket of CPU parameters keeps them in its host
    buffers; any other bucket is staged (:mod:`hpctrain.comm.staging`): the gradients live in
    device buffers and cross to the host buffers around each reduction; host memory the CUDA
    driver did not allocate (a shared window) is registered with it until ``Bucket.release``.
    With ``direct_ok`` (the strategy lets MPI sum the bucket's own buffers) and an MPI library
    that takes device buffers (:func:`hpctrain.comm.staging.mpi_takes_device_buffers`) a device
    bucket's buffers are on the device and go to MPI as they are, with no staging; with
    ``one_rank`` (a communicator of one) a CUDA bucket of such a strategy never stages
    (:func:`hpctrain.comm.staging.direct_route`).
    ``HPCTRAIN_TEST_STAGING=1`` routes CPU buckets like device ones (tests).
    """
    alloc = alloc or (lambda n, dtype, i, which, pinned=False: torch.zeros(n, dtype=dtype, pin_memory=pinned))
    force = staging_lib.forced()
    registry = staging_lib.HostRegistry(staging_lib.cuda_mpi.cudart())
    out = []
    for i, group in enumerate(_groups(params, bucket_bytes)):
        offsets = np.cumsum([0] + [p.numel() for p in group[:-1]]).tolist()
        n, dtype, device = sum(p.numel() for p in group), group[0].dtype, group[0].device
        direct = staging_lib.direct_route(device.type, forced=force, direct_ok=direct_ok, one_rank=one_rank,
                                          mpi_takes=lambda: staging_lib.mpi_takes_device_buffers(device))  # noqa: B023
        where = staging_lib.route(device.type, forced=force, direct=direct)
        staging = None
        if where == "direct" and one_rank:  # the mean of one rank is its gradient: one buffer
            buf = torch.zeros(n, dtype=dtype, device=device)    # in both roles, nothing copied
            bufs = [buf, buf]
        elif where == "direct":     # MPI reads the device buffers themselves: nothing to stage
            bufs = [torch.zeros(n, dtype=dtype, device=device) for _ in (0, 1)]
        elif where == "staged":
            staging = staging_lib.Staging(n, dtype, device, registry)
            pinned = staging_lib.pin_host()
            bufs = [alloc(n, dtype, i, which, pinned=True) if pinned else alloc(n, dtype, i, which)
                    for which in (0, 1)]
        else:
            bufs = [alloc(n, dtype, i, which) for which in (0, 1)]
        bucket_wire = wire(i, n, dtype) if wire is not None else Wire()
        if staging is not None:
            bucket_wire.stage(staging)
        out.append(Bucket(params=group, offsets=offsets, bufs=bufs, index=i, wire=bucket_wire, staging=staging))
    registry.register([buf for b in out if b.staging is not None for buf in b.bufs])
    return out


def bucket_sizes(params, bucket_bytes: int) -> list[tuple[int, torch.dtype]]:
    """``(n_elems, dtype)`` of each bucket :func:`make_buckets` would build (allocates nothing)."""
    return [(sum(p.numel() for p in g), g[0].dtype) for g in _groups(params, bucket_bytes)]
