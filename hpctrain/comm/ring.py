"""Ring allreduce (reduce-scatter, then allgather) of a flat buffer, any wire codec.

Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations"
(JPDC 2009); the NCCL/Horovod/Baidu ring. Each rank sends and receives 2(n-1)/n of the buffer
and sums (n-1)/n of it, whatever n is. Messages are ``Isend``/``Irecv`` pairs with a neighbour,
posted by a generator (see :mod:`hpctrain.comm.progress`) so the ring can run overlapped.

Why our own ring rather than MPI's ``Allreduce``:
* FP16 on the wire needs it: MPI has no half-precision sum.
* It is non-blocking at the full speed of a blocking call, where Open MPI 4.1's ``Iallreduce``
  (libnbc) is markedly slower than its ``Allreduce`` on large buffers.
* Every rank ends with the same bytes (each chunk is summed once, by one rank, then copied), so
  the overflow flag taken from the reduced values agrees everywhere.
Below ``SMALL_BYTES`` a full-precision buffer goes by ``Iallreduce``: there the 2(n-1) message
latencies of the ring cost more than the bandwidth saved; strategies keep such buckets
uncompressed. Up to
``MPI_MAX_BYTES`` a full-precision buffer goes by MPI's own allreduce (faster there):
:func:`mpi_choice`. Its non-blocking ``Iallreduce`` wherever reductions run concurrently (a
bucket started by an overlap hook or ``begin()``, and always inside ``hierarchical``): a rank
blocked inside a collective cannot advance the other buckets' rings and node barriers, which are
driven from Python, and a peer waiting on one of those would never reach the collective — a
deadlock MPICH showed at 4 ranks on 2 emulated nodes. Its blocking ``Allreduce`` where ``flat``
starts a round only to wait for it (``blocking=True``): Open MPI 4.1's tuned blocking
algorithms beat libnbc's ``Iallreduce``, and both give the same bytes (checked at 4 ranks
under Open MPI and MPICH, and by ``tests/mpi/test_comm_overlap.py``).

Device buffers (a ``flat`` bucket under a CUDA-aware MPI) never reach a non-blocking collective
unless the library's non-blocking collectives take device memory
(:func:`hpctrain.comm.cuda_mpi.nonblocking_device_ok`; Open MPI's libnbc reduces on the CPU and
crashes on it): such a bucket of MPI's goes by blocking ``Allreduce`` in a blocking round and by
the ring (``Isend``/``Irecv``, which a CUDA-aware MPI does take) otherwise (:func:`mpi_route`).

The measurements behind these choices, with machine and date: docs/environment.md.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
from mpi4py import MPI

from hpctrain.comm import cuda_mpi, streams
from hpctrain.comm.fused import scale_and_check
from hpctrain.comm.progress import Reduction
from hpctrain.comm.staging import DONE, Ready

SMALL_BYTES = 64 * 1024
MPI_MAX_BYTES = 4 * 2**20
"""Full-precision buffers up to this size go through MPI's allreduce instead of the ring
(:func:`mpi_choice`, ``comm.tune = static``), in the spirit of Open MPI's own size-based
decision rules. Measured on 2 and 4 ranks against flat's blocking ``Allreduce`` plus the
mean and inf/NaN check: MPI ahead for small buffers, even about this size, the ring ahead
above it (it folds the mean and the check into its last add; docs/environment.md).
``comm.tune = measure`` times both per bucket instead (:mod:`hpctrain.comm.tuner`)."""
TAG_SCATTER, TAG_GATHER = 11, 12


def chunk_bounds(n_elems: int, n_parts: int) -> list[int]:
    """Boundaries of ``n_parts`` near-equal contiguous chunks (mpi4py-fft ``_blockdist`` idea)."""
    return [n_elems * i // n_parts for i in range(n_parts + 1)]


AS_TENSOR = frozenset({"cuda"})
"""Device types whose buffers go to MPI as the tensors themselves (mpi4py reads their DLPack /
``__cuda_array_interface__``; a CUDA-aware MPI then moves device memory directly). CPU buffers go
as NumPy views, the path measured in the benchmarks. Tests add ``"cpu"`` to run the tensor
hand-off on CPU tensors (mpi4py 4 takes them through DLPack too)."""


def _on(stream):
    """Run the ring's kernels on its own stream (device buffers), or where they are (host)."""
    return streams.API.stream(stream) if stream is not None else contextlib.nullcontext()


def _settled(ready):
    """Generator: before MPI reads device memory a ring kernel wrote (a CUDA-aware MPI does not
    order itself after torch's streams), wait for that kernel's event, polled like a request:
    the ring's own stream only, never the compute stream, which keeps running backward."""
    if not ready.test():
        yield [ready]


def _arr(t: torch.Tensor):
    """A contiguous tensor as an MPI buffer (typed: MPI infers the datatype)."""
    t = t.detach()
    return t if t.device.type in AS_TENSOR else t.numpy()


def _msg(t: torch.Tensor):
    """Bytes of a contiguous tensor as an MPI message (MPI has no float16 datatype)."""
    t = t.detach().view(torch.uint8)
    return [t if t.device.type in AS_TENSOR else t.numpy(), MPI.BYTE]


def mpi_choice(n_bytes: int, codec) -> str:
    """How a full-precision buffer of ``n_bytes`` is summed: ``"mpi"`` (MPI's ``Iallreduce``, up
    to ``MPI_MAX_BYTES``, where Open MPI's algorithms beat the ring) or ``"ring"``. A pure
    function of the size and the codec, so every rank, and the overlapped and blocking paths,
    choose alike (bit-identical results). Compressed buffers always take the ring (MPI cannot
    sum fp16)."""
    if not codec.mpi_summable:
        return "ring"
    return "mpi" if n_bytes <= MPI_MAX_BYTES else "ring"


def nonblocking_mpi_ok(device) -> bool:
    """May MPI's non-blocking collectives take buffers on ``device``? Host memory (handed over
    as NumPy views): yes. Memory handed over as tensors (:data:`AS_TENSOR`, device memory):
    only where :func:`hpctrain.comm.cuda_mpi.nonblocking_device_ok` says so."""
    if torch.device(device).type not in AS_TENSOR:
        return True
    return cuda_mpi.nonblocking_device_ok()[0]


def mpi_route(blocking: bool, nbc_ok: bool) -> str:
    """How a buffer :func:`mpi_choice` gives to MPI is summed this round: ``"Allreduce"`` (a
    blocking round), ``"Iallreduce"``, or ``"ring"`` where the buffer is memory MPI's
    non-blocking collectives cannot take (``nbc_ok`` False: device memory under Open MPI)."""
    if blocking:
        return "Allreduce"
    return "Iallreduce" if nbc_ok else "ring"


class RingBuffers:
    """What one ring needs, allocated once: a receive area and the codec's scratch for widening
    a chunk (fp16: fp32 accumulation). ``method`` is :func:`mpi_choice`'s verdict; ``nbc_ok``
    (:func:`nonblocking_mpi_ok` of ``device``) whether its non-blocking rounds may use MPI's
    ``Iallreduce``; where not, the ring's buffers are allocated for them too."""

    __slots__ = ("recv", "scratch", "bounds", "method", "nbc_ok", "stream", "step_done", "on_device")

    def __init__(self, n_elems: int, dtype, n_ranks: int, codec, method: str = "ring", device="cpu"):
        self.bounds = chunk_bounds(n_elems, n_ranks)
        self.method = method if n_ranks > 1 else "ring"
        # Device memory (AS_TENSOR; tests add "cpu"): the overflow flag stays on the device
        # (fused.scale_and_check ``keep``), read once per round by GradSync.finish.
        self.on_device = torch.device(device).type in AS_TENSOR
        self.nbc_ok = self.method == "ring" or nonblocking_mpi_ok(device)
        largest = max((b - a for a, b in zip(self.bounds, self.bounds[1:])), default=0)
        largest = largest if n_ranks > 1 and (self.method == "ring" or not self.nbc_ok) else 0
        self.recv = torch.empty(largest, dtype=dtype, device=device)     # beside the buffer summed
        scratch = codec.scratch(largest)
        if torch.device(device).type != "cpu":
            scratch = (tuple(t.to(device) for t in scratch) if isinstance(scratch, tuple)
                       else scratch.to(device))
        self.scratch = scratch
        # Device buffers: the ring's kernels run on a stream of its own and MPI reads what they
        # wrote once this event (re-recorded each step) has completed (:func:`_settled`).
        api = streams.API
        self.stream = api.Stream(device) if api.handles(device) and n_ranks > 1 else None   # one rank: no kernels
        self.step_done = Ready(api.Event()) if self.stream is not None else DONE
        if self.stream is not None:     # the buffers above were made on the compute stream
            self.stream.wait_stream(api.current_stream(device))


def allreduce_bucket(buf: RingBuffers, comm: MPI.Comm, codec, src: torch.Tensor, dst: torch.Tensor,
                     scale: float = 1.0, blocking: bool = False) -> Reduction:
    """Generator: ``dst <- scale * sum over comm of src``, in the codec's wire format; returns the
    overflow flag (inf/NaN in the result), the same on every rank. By the ring below, or by MPI's
    ``Allreduce``/``Iallreduce`` where :func:`mpi_route` gives the buffer to MPI (hence the name).

    Out of place (``dst`` may be ``src``): ``src`` is only read, so a rank's own gradients stay
    intact in it while the mean lands in ``dst`` - at no extra memory traffic, since every add of
    the reduce-scatter writes a new value anyway (``dst[c] = src[c] + received``) and the
    allgather receives into ``dst``. ``scale`` is folded into the last add of each chunk (a pass
    over 1/n of the buffer while it is in cache, instead of a pass over all of it).
    ``comm`` should carry no other traffic while this runs (each bucket gets its own ``Dup``),
    so messages of concurrently running rings cannot match each other.

    ``blocking`` (a buffer :func:`mpi_choice` gives to MPI): call MPI's blocking ``Allreduce``
    instead of posting ``Iallreduce`` (Open MPI 4.1's tuned blocking algorithms are up to 2x
    faster than libnbc's). Only for a caller that would wait at once and whose every rank makes
    the same choice for this bucket (blocking and non-blocking collectives do not match each
    other), and never while a peer may need this rank's Python-driven progress elsewhere first
    (module docstring): :class:`hpctrain.comm.flat.FlatSync` in a round that no hook and no
    ``begin()`` started. A non-blocking round of a device buffer whose MPI cannot take it in
    ``Iallreduce`` runs the ring instead (:func:`mpi_route`).
    """
    if src.numel() == 0:
        return False
    keep = buf.on_device        # the overflow flag stays on the device: no host sync per bucket
    if comm.Get_size() == 1:
        if dst is not src:
            dst.copy_(src)
        return scale_and_check(dst, scale, keep)
    route = "ring" if buf.method == "ring" else mpi_route(blocking, buf.nbc_ok)
    if route != "ring":
        return (yield from _by_mpi(route, comm, src, dst, scale, keep))
    found = yield from _reduce_scatter(buf, comm, codec, src, dst, scale, keep)
    yield from _settled(buf.step_done)  # the allgather sends the chunk completed last
    return (yield from _allgather(buf, comm, dst, found, keep))


def _by_mpi(route: str, comm: MPI.Comm, src: torch.Tensor, dst: torch.Tensor, scale: float, keep: bool):
    """Generator: MPI's own sum (``Allreduce`` or ``Iallreduce``); every rank holds its identical result."""
    send = MPI.IN_PLACE if src.data_ptr() == dst.data_ptr() else _arr(src)
    if route == "Allreduce":
        comm.Allreduce(send, _arr(dst), op=MPI.SUM)
    else:
        yield [comm.Iallreduce(send, _arr(dst), op=MPI.SUM)]
    return scale_and_check(dst, scale, keep)


def _chunk(bounds: list[int], n: int, i: int) -> slice:
    """Chunk ``i`` (mod ``n``) of the buffer."""
    i %= n
    return slice(bounds[i], bounds[i + 1])


def _reduce_scatter(buf: RingBuffers, comm: MPI.Comm, codec, src: torch.Tensor, dst: torch.Tensor,
                    scale: float, keep: bool):
    """Generator: at step s send chunk r-s (my own at s=0, a partial sum after), receive chunk
    r-s-1 and add my share: ``dst[c] = src[c] + received``. At the last step chunk r+1 is complete
    here: scaled, and the codec says whether it holds inf/NaN (returned; with ``keep`` the flag
    stays on the device and False is returned)."""
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    found = False
    for s in range(n - 1):
        send, recv = _chunk(buf.bounds, n, r - s), _chunk(buf.bounds, n, r - s - 1)
        tmp = buf.recv[:recv.stop - recv.start]
        if s:                           # MPI reads the partial sum the last step's kernel wrote
            yield from _settled(buf.step_done)
        yield [comm.Isend(_msg((src if s == 0 else dst)[send]), right, TAG_SCATTER),
               comm.Irecv(_msg(tmp), left, TAG_SCATTER)]
        last = s == n - 2
        with _on(buf.stream):
            found = codec.reduce(dst[recv], tmp, buf.scratch, check=last and not keep, src=src[recv],
                                 scale=scale if last else 1.0)
            if buf.stream is not None:
                buf.step_done.event.record(buf.stream)
    return found


def _allgather(buf: RingBuffers, comm: MPI.Comm, dst: torch.Tensor, found: bool, keep: bool):
    """Generator: every rank's completed chunk around the ring; returns the overflow flag. Host
    flags, OR-ed over the ranks, travel with the allgather; with ``keep`` every rank ends with the
    same bytes, so the device flag of the whole result agrees everywhere with none to exchange."""
    n, r = comm.Get_size(), comm.Get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    if keep:
        for s in range(n - 1):
            send, recv = _chunk(buf.bounds, n, r - s + 1), _chunk(buf.bounds, n, r - s)
            yield [comm.Isend(_msg(dst[send]), right, TAG_GATHER), comm.Irecv(_msg(dst[recv]), left, TAG_GATHER)]
        return scale_and_check(dst, 1.0, keep=True)
    flag = np.array([found], dtype=np.uint8)
    reqs = [comm.Iallreduce(MPI.IN_PLACE, flag, op=MPI.MAX)]
    for s in range(n - 1):
        send, recv = _chunk(buf.bounds, n, r - s + 1), _chunk(buf.bounds, n, r - s)
        yield reqs + [comm.Isend(_msg(dst[send]), right, TAG_GATHER),
                      comm.Irecv(_msg(dst[recv]), left, TAG_GATHER)]
        reqs = []
    return bool(flag[0])

