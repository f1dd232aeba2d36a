"""A run directory belongs to one job at a time, and its checkpoints to one run.

* :class:`RunLock`: rank 0 holds an exclusive ``fcntl.flock`` on ``RUN_DIR/.lock`` for the run's
  life and writes its holder (pid, host, start time) into it. The kernel drops the lock when the
  process ends however it ends (``kill -9``, ``MPI_Abort``), so a crashed run leaves no stale
  lock; a second job finds it held and stops at start-up, before writing anything, naming the
  holder. On NFSv4 and on Lustre mounted with ``-o flock`` the lock holds across nodes; Lustre's
  ``-o localflock`` only within a node; a file system without ``flock`` gets a warning, no lock.
* :func:`held_run_dir`: the same check as a quick look before MPI and torch are loaded (the
  second job is refused in a second, not after its heavy imports); the lock itself is still
  taken as above, and :meth:`RunLock.acquire` tries again for a moment should it meet such a look.
* :func:`run_identity`: ``RUN_DIR/run_id``, a random id made at a fresh start and kept by every
  resume. Checkpoints carry it, so ``ckpt.resume=auto`` never continues another run's weights.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from hpctrain.errors import UserError
from hpctrain.ops.fileio import atomic_write_text, why

if TYPE_CHECKING:                      # no MPI_Init for `hpctrain status`, which reads the lock
    from mpi4py import MPI

LOCK_NAME = ".lock"
RUN_ID_NAME = "run_id"
# flock not provided by the file system (Lustre without -o flock/localflock, some FUSE mounts)
NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL)
BUSY = (errno.EWOULDBLOCK, errno.EACCES)
# a look (holder(): a shared lock for microseconds) must not refuse a job taking the lock
ACQUIRE_TRIES, ACQUIRE_PAUSE_S = 5, 0.05
WORLD_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "PALS_RANKID", "FLUX_TASK_RANK", "SLURM_PROCID")


class RunDirBusy(UserError):
    """Another job holds the run directory (the message names it)."""


def in_use(directory: str, lock_path: str, holder: str) -> str:
    """The refusal's line."""
    return (f"run directory {directory} is in use by {holder} (lock {lock_path}); wait for that job to end "
            f"or choose another --run-dir")


def describe_holder(text: str) -> str:
    """``pid 123 on host n01 since 2026-11-25 14:02:29 UTC`` from a lock file's JSON."""
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on host {h['host']} since {h['start']}"
    except (ValueError, KeyError, TypeError):
        return "a job that has not yet recorded itself"


class RunLock:
    """An exclusive ``flock`` on ``DIRECTORY/.lock`` (local: take it on one rank)."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, LOCK_NAME)
        self.fd: int | None = None
        self.warning: str | None = None     # why no lock is held although nobody else holds it

    def acquire(self) -> None:
        """Take the lock and record this process in it; :class:`RunDirBusy` if another job has it."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        # no O_TRUNC: the holder's record; no link followed (a planted one would have its target emptied)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            for tries_left in range(ACQUIRE_TRIES - 1, -1, -1):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in BUSY or not tries_left:
                        raise
                    time.sleep(ACQUIRE_PAUSE_S)     # a look by holder() lasts microseconds; a job, its run
        except OSError as exc:
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            if exc.errno in BUSY:
                raise RunDirBusy(in_use(os.path.dirname(self.path), self.path, describe_holder(holder))) from None
            if exc.errno in NO_FLOCK:
                self.warning = (f"cannot lock {self.path} ({os.strerror(exc.errno)}): this file system has no "
                                f"flock (Lustre: mount with -o flock); nothing stops a second job using this "
                                f"directory")
                return
            raise
        start = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "start": start}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record + b"\n", 0)
        self.fd = fd

    def release(self) -> None:
        """Empty the record and drop the lock; idempotent."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)             # closing the last descriptor releases the flock
            self.fd = None

    def holder(self) -> str | None:
        """Who holds the lock now (a description), or None if nobody does. Local; does not keep it."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None
        except OSError as exc:
            if exc.errno in BUSY:
                return describe_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
            return None
        finally:
            os.close(fd)


def held_run_dir(directories: list[str]) -> str | None:
    """Local, before MPI and torch: the refusal's line if another job holds one of ``directories``,
    else None (a directory not made yet, or not one at all, is left to the checks that follow).
    Every rank looks for itself: a shared file system shows each the same holder."""
    for d in dict.fromkeys(os.path.abspath(d) for d in directories):
        lock = RunLock(d)
        try:
            holder = lock.holder()
        except OSError:
            holder = None
        if holder is not None:
            return in_use(d, lock.path, holder)
    return None


def launcher_rank(environ=os.environ) -> int | None:
    """This process's world rank as the launcher set it (before MPI_Init), or None."""
    for name in WORLD_RANK_VARS:
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


@contextlib.contextmanager
def hold_run_dirs(comm: MPI.Comm, directories: list[str]) -> Iterator[None]:
    """Collective: rank 0 locks each directory for the ``with`` block; every rank raises the same
    :class:`RunDirBusy` (status 2, one line) if another job holds one."""
    locks, error = [], None
    if comm.Get_rank() == 0:
        try:
            for d in dict.fromkeys(os.path.abspath(d) for d in directories):
                lock = RunLock(d)
                lock.acquire()
                locks.append(lock)
                if lock.warning:
                    print(f"hpctrain: warning: {lock.warning}", file=sys.stderr, flush=True)
        except (RunDirBusy, OSError) as exc:
            error = str(exc) if isinstance(exc, RunDirBusy) else f"cannot lock {d}: {why(exc, lock.path)}"
            for lock in locks:
                lock.release()
            locks = []
    try:
        error = comm.bcast(error, root=0)     # rank 0 alone decides: the same line on every rank
        if error:
            raise RunDirBusy(error)
        yield
    finally:
        for lock in locks:
            lock.release()


def run_identity(comm: MPI.Comm, run_dir: str, fresh: bool) -> str:
    """Collective: this run's id (``RUN_DIR/run_id``): a new one on a ``fresh`` start, else the
    directory's (made if it has none). Call while holding the run directory's lock."""
    run_id, error = None, None
    if comm.Get_rank() == 0:
        path = os.path.join(run_dir, RUN_ID_NAME)
        try:
            if not fresh and os.path.exists(path):
                with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW)) as fh:
                    run_id = fh.read().strip()
            if not run_id:
                run_id = uuid.uuid4().hex[:16]
                atomic_write_text(path, run_id + "\n")
        except OSError as exc:
            error = f"run directory {run_dir}: cannot read or write {RUN_ID_NAME}: {why(exc, path)}"
    run_id, error = comm.bcast((run_id, error), root=0)
    if error:
        raise UserError(error)
    return run_id
