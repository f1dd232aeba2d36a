"""``torch.distributed`` started from an MPI launch: no MASTER_ADDR, no MASTER_PORT, no torchrun.

torch's own rendezvous needs an address and a port that every rank knows before it starts, which
under ``mpiexec`` or ``srun`` someone must invent and export (the usual cause of DDP's start-up
failures on Slurm: a port in use, a host name that resolves to loopback). MPI already connects the
ranks, so it carries the rendezvous instead: rank 0 opens torch's ``TCPStore`` on a port the
kernel picks (port 0), and one MPI broadcast tells every other rank where it is. Rank and world
size are MPI's; ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are exported for
scripts written for torchrun. The node-local rank comes from hpctrain's
:class:`~hpctrain.topology.Topology` (ranks that share memory; ``HPCTRAIN_RANKS_PER_NODE``
emulates nodes), and binds a GPU where the backend is NCCL.
"""
from __future__ import annotations

import atexit
import datetime
import gc
import os
import socket
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

from hpctrain.errors import UserError
from hpctrain.ops.abort import install_abort_hook
from hpctrain.topology import Topology, emulated_ranks_per_node

STORE_TIMEOUT = datetime.timedelta(minutes=5)


class RendezvousError(UserError, RuntimeError):
    """The store could not be opened or reached (every rank raises it together)."""


_topo: Topology | None = None
_states: list = []        # HookStates on this topology, closed by destroy_process_group


def default_backend() -> str:
    """``gloo`` on CPU; ``cpu:gloo,cuda:nccl`` where CUDA is present and NCCL built in."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def advertised_host(names: list[str]) -> str:
    """The address rank 0 tells the others: ``MASTER_ADDR`` or ``HPCTRAIN_NODE_ADDR`` where set;
    loopback when every rank is on rank 0's host; else the address of rank 0's interface that
    routes to another rank's host (found by a UDP ``connect``, which sends nothing) - not the
    host name, which on many systems resolves to 127.0.1.1."""
    for var in ("MASTER_ADDR", "HPCTRAIN_NODE_ADDR"):
        if os.environ.get(var, "").strip():
            return os.environ[var].strip()
    others = [n for n in names if n != names[0]]
    if not others:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((others[0], 9))
            return s.getsockname()[0]
    except OSError:
        return socket.getfqdn()


def _port() -> int:
    raw = os.environ.get("MASTER_PORT", "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise RendezvousError(f"hpctrain.ddp: MASTER_PORT={raw!r} is not a port number (unset it to "
                              "let rank 0 pick a free one)")
    return int(raw)


def _resolves(host: str) -> None:
    """Fail at once on an address nobody can connect to (torch would retry until its timeout)."""
    try:
        socket.getaddrinfo(host, None)
    except OSError as exc:
        raise RendezvousError(f"hpctrain.ddp: rendezvous address {host!r} (MASTER_ADDR or "
                              f"HPCTRAIN_NODE_ADDR) does not resolve on rank 0 ({exc.strerror or exc})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def open_store(comm: MPI.Comm, timeout: datetime.timedelta = STORE_TIMEOUT) -> dist.TCPStore:
    """Rank 0 serves a ``TCPStore`` on ``MASTER_PORT`` or a free port, the others connect to the
    address MPI broadcasts (collective). A failure on any rank raises :class:`RendezvousError`
    on every rank, naming the address and the ranks that could not reach it."""
    rank, size = comm.Get_rank(), comm.Get_size()
    names = comm.gather(socket.gethostname(), root=0)
    store: dist.TCPStore | None = None
    where: tuple[str, int] | str | None = None      # rank 0's address, or why it has none
    if rank == 0:
        assert names is not None            # the root's gather
        host, port = advertised_host(names), None
        try:
            port = _port()
            _resolves(host)
            store = dist.TCPStore(host, port, size, True, timeout=timeout, wait_for_workers=False)
            where = (host, store.port)
        except RendezvousError as exc:
            where = str(exc)
        except Exception as exc:        # noqa: BLE001 - reported on every rank below
            where = (f"hpctrain.ddp: rank 0 cannot open the rendezvous store at {host}:{port or 'a free port'} "
                     f"({_first_line(exc)}); set MASTER_ADDR to an address of rank 0's node (and "
                     "MASTER_PORT, if set, to a free port)")
    where = comm.bcast(where, root=0)
    if isinstance(where, str):
        raise RendezvousError(where)
    host, port = where
    error = None
    if rank != 0:
        try:
            store = dist.TCPStore(host, port, size, False, timeout=timeout)
        except Exception as exc:        # noqa: BLE001
            error = _first_line(exc)
    errors = comm.allgather(error)
    bad = [r for r, e in enumerate(errors) if e]
    if bad:
        raise RendezvousError(f"hpctrain.ddp: rank(s) {', '.join(map(str, bad))} cannot reach the "
                              f"rendezvous store at {host}:{port} on rank 0 ({errors[bad[0]]}); set "
                              "MASTER_ADDR to an address of rank 0's node that every node reaches")
    assert store is not None            # made on every rank, or raised above
    return store


def _export_ranks(topo: Topology) -> None:
    """torchrun's variables, for scripts that read them (collective). A ``RANK`` or
    ``WORLD_SIZE`` already set to another value than MPI's is one line on every rank."""
    want = {"RANK": topo.rank, "WORLD_SIZE": topo.size, "LOCAL_RANK": topo.local_rank,
            "LOCAL_WORLD_SIZE": topo.local_size}
    conflict = next((f"{var}={os.environ[var].strip()} in the environment but MPI says {want[var]}"
                     for var in ("RANK", "WORLD_SIZE")
                     if os.environ.get(var, "").strip() not in ("", str(want[var]))), None)
    conflicts = topo.comm.allgather(conflict)
    bad = [r for r, c in enumerate(conflicts) if c]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise RendezvousError(f"hpctrain.ddp: {conflicts[bad[0]]} on rank {bad[0]}{more}: launch with "
                              "mpiexec or srun only, not torchrun as well")
    for var, value in want.items():
        os.environ[var] = str(value)


def init_process_group(backend: str | None = None, *, comm: MPI.Comm | None = None, **kwargs) -> None:
    """``torch.distributed.init_process_group`` for a job started by ``mpiexec``/``srun``.

    ``backend=None``: gloo on CPU, ``cpu:gloo,cuda:nccl`` where CUDA is present (then this rank's
    GPU, local rank modulo visible GPUs, is made current). An explicit backend is used as given.
    ``MASTER_ADDR``/``MASTER_PORT`` are honoured where set (the address rank 0 advertises, the
    port it serves), never required. ``init_method=`` or ``store=`` in ``kwargs`` bypass the
    rendezvous; other keywords (``timeout``, ``pg_options``, ...) go to torch. ``comm`` (default
    ``MPI.COMM_WORLD``) is the ranks of the job. Collective.
    """
    global _topo
    if dist.is_initialized():
        raise RuntimeError("hpctrain.ddp: torch.distributed is already initialised "
                           "(call hpctrain.ddp.init_process_group once, instead of torch's)")
    comm = MPI.COMM_WORLD if comm is None else comm
    install_abort_hook(comm)        # a rank failing during the rendezvous ends the job, no hang
    backend = default_backend() if backend is None else backend
    topo = Topology.create(comm.Dup(), emulated_ranks_per_node())
    try:
        _export_ranks(topo)
        if "cuda:nccl" in backend or backend == "nccl":
            from hpctrain.api import bind_device
            bind_device(topo, "cuda")
        kwargs.setdefault("rank", topo.rank)
        kwargs.setdefault("world_size", topo.size)
        ours = "init_method" not in kwargs and "store" not in kwargs
        if ours:
            kwargs["store"] = open_store(topo.comm, kwargs.get("timeout") or STORE_TIMEOUT)
        dist.init_process_group(backend, **kwargs)
    except BaseException:
        _close_topology(topo)
        raise
    _topo = topo
    atexit.register(_release_before_exit)
    # Again after torch's: it wraps the hook it finds in one that buffers its output, which ours
    # (ending the process) would lose. An uncaught exception on any rank ends the whole job.
    install_abort_hook(comm)
    given = [v for v in ("MASTER_ADDR", "MASTER_PORT") if os.environ.get(v, "").strip()]
    if ours and given and topo.rank == 0:
        sys.stderr.write(f"hpctrain.ddp: rendezvous on {' and '.join(given)} from the environment "
                         "(unset to let rank 0 pick its address and a free port)\n")


def _release_before_exit() -> None:
    """Tear torch's process group down while the interpreter can still run its threads.

    A DDP module holds the process group through reference cycles, so without this the group
    (and gloo's worker threads) outlives ``main()`` and dies during interpreter finalisation: a
    worker that then frees a tensor must take the GIL, Python ends such a thread with
    ``pthread_exit``, and the C++ thread aborts the process (SIGABRT after a clean run, 1 run in 4
    of ``examples/ddp/train.py`` here). Local: no collective, so a rank may exit alone."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def _close_topology(topo: Topology) -> None:
    comm = topo.comm
    topo.close()
    comm.Free()


def destroy_process_group() -> None:
    """Close the hook states on this process group (collective), then torch's process group."""
    global _topo
    for state in list(_states):
        state.close()
    _states.clear()
    if dist.is_initialized():
        dist.destroy_process_group()
    if _topo is not None:
        topo, _topo = _topo, None
        _close_topology(topo)


def topology() -> Topology | None:
    """The topology :func:`init_process_group` built (None before it, or after destroy)."""
    return _topo


def _require() -> Topology:
    if _topo is None:
        raise RuntimeError("hpctrain.ddp: call hpctrain.ddp.init_process_group() first")
    return _topo


def rank() -> int:
    return _require().rank


def size() -> int:
    return _require().size


def local_rank() -> int:
    """This rank's index on its node (``LOCAL_RANK``): bind a device with it."""
    return _require().local_rank


def local_size() -> int:
    return _require().local_size


def track(state) -> None:
    """Have :func:`destroy_process_group` close ``state`` (a HookState on this topology)."""
    _states.append(state)


def untrack(state) -> None:
    if state in _states:
        _states.remove(state)
