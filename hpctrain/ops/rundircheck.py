"""File-system surprises in a run directory, found at start-up rather than hours later.

What the job will write — ``metrics.jsonl`` (appended), ``state.json``, ``run_id`` and
``timeline.json`` (replaced atomically), the checkpoints — is checked once rank 0 holds the run
directory and before anything is written: each name that exists must be a regular file (a
directory, FIFO, socket or device in its place is refused: opening a FIFO would block forever),
``metrics.jsonl`` must open for appending, a replaced one must not be immutable or append-only
(``chattr +i``/``+a``: the rename over it would fail at the end of the run), none of them nor
``.lock`` may be a symbolic link (the job never writes through one: :mod:`hpctrain.ops.fileio`),
and the run directory and the checkpoint directory must take a new file (a read-only mount or
permissions; one not made yet: where it will be). A problem is one line naming the path
(:class:`RunDirError`, status 2) on every rank; the checkpoint that would have failed at the end
of a day's training fails in the first second instead.
"""
from __future__ import annotations

import fcntl
import os
import stat
import tempfile

from hpctrain.errors import UserError

FILES = ("metrics.jsonl", "state.json", "run_id", "timeline.json")
APPENDED = ("metrics.jsonl",)
LINKS_REFUSED = FILES + (".lock",)
# Linux's inode flags (linux/fs.h): FS_IOC_GETFLAGS, and the two that stop a rename over the file
FS_IOC_GETFLAGS, FS_IMMUTABLE_FL, FS_APPEND_FL = 0x80086601, 0x10, 0x20


class RunDirError(UserError):
    """The run or checkpoint directory cannot take what the job will write (message names the path)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "a file" if stat.S_ISREG(mode) else "not a regular file"


def _flags_problem(path: str) -> str | None:
    """Why a file cannot be replaced though it can be opened (immutable, append-only), or None
    (also where the file system keeps no such flags)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        flags = int.from_bytes(buf[:4], "little")
    except OSError:
        return None
    finally:
        os.close(fd)
    for bit, name in ((FS_IMMUTABLE_FL, "immutable"), (FS_APPEND_FL, "append-only")):
        if flags & bit:
            return (f"{path} is {name} (chattr): it cannot be replaced; clear it (chattr -i/-a) or choose "
                    f"another --run-dir")
    return None


def _writable_dir(directory: str) -> str | None:
    """Why ``directory`` (or, while it does not exist, its nearest existing ancestor, where it will
    be made: nothing is created here) cannot take a new file, or None."""
    where = os.path.abspath(directory)
    while not os.path.lexists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        fd, probe = tempfile.mkstemp(prefix=".hpctrain-probe-", dir=where)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{directory}: cannot write there ({exc.strerror or exc})"
    return None


def run_dir_problem(run_dir: str, ckpt_dir: str) -> str | None:
    """Why the job could not write its run directory or checkpoints, or None (module docstring)."""
    problem = _writable_dir(run_dir)
    if problem:
        return problem
    for name in LINKS_REFUSED:
        path = os.path.join(run_dir, name)
        if os.path.islink(path):
            return (f"{path} is a symbolic link: hpctrain does not write through links in a run directory; "
                    f"remove it or choose another --run-dir")
    for name in FILES:
        path = os.path.join(run_dir, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{path}: {exc.strerror or exc}"
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is {_kind(st.st_mode)}, not a file: move it away or choose another --run-dir"
        if name in APPENDED:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW))
            except OSError as exc:
                return f"{path}: cannot append to it ({exc.strerror or exc})"
        else:
            problem = _flags_problem(path)
            if problem:
                return problem
    if os.path.lexists(ckpt_dir) and not os.path.isdir(ckpt_dir):
        return f"{ckpt_dir} is {_kind(os.stat(ckpt_dir).st_mode) if os.path.exists(ckpt_dir) else 'a broken link'}, " \
               f"not a directory: checkpoints cannot be written there"
    return _writable_dir(ckpt_dir)
