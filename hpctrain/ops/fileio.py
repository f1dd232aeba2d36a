"""Whole-or-absent file writes: a reader sees the old file or the new one, never part.

Replaced files (the POSIX rename idiom, :func:`atomic_open`): write a hidden temporary
``.NAME.tmp-PID`` in the same directory, fsync it, rename it over ``NAME``, fsync the directory
(so the rename itself survives a crash). A writer that fails removes its temporary; one that is
killed leaves only the hidden temporary behind. Used for shards and their index, checkpoints,
``state.json``, ``run_id``, the timeline and the report's plots.

Appended files (:func:`open_append`, :func:`append_whole`): a record is one ``write`` of whole
lines; one that fails (a full disk, a file size limit, an immutable file) is cut back to the
length before it, so the file never ends in half a line.

Links are never followed where hpctrain writes: every file is opened with ``O_NOFOLLOW`` and
every temporary is new (``O_EXCL``), so a link planted in a run directory (to someone's
``~/.bashrc``, say) fails the open (``ELOOP``) instead of emptying or overwriting its target; a
rename replaces a link itself, never what it points to.
"""
from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import IO, Any

from hpctrain.errors import LocalUserError

NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
APPEND = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class WriteError(LocalUserError):
    """A file the job writes could not be written (one line naming it; status 2). Raised by the
    rank that writes it, alone: the abort hook ends the job with that line."""


def why(exc: OSError, path: str) -> str:
    """The one-line reason ``path`` could not be opened or written."""
    if exc.errno == errno.ELOOP:
        return f"{path} is a symbolic link: hpctrain does not follow links where it writes; remove it"
    return f"{path}: cannot write: {exc.strerror or exc}"


def open_append(path: str) -> int:
    """A descriptor appending to ``path`` (made if missing; a link is refused: ``ELOOP``). A file
    that ends in a cut line (written by an older hpctrain) gets its newline first, so the next
    record is not glued to it."""
    fd = os.open(path, APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            append_whole(fd, b"\n")
    except OSError:
        os.close(fd)
        raise
    return fd


def append_whole(fd: int, data: bytes) -> None:
    """Append ``data`` (whole lines) to ``fd``, all of it or none: on an error the file is cut back
    to its length before, then the error is raised."""
    size = os.fstat(fd).st_size
    view, done = memoryview(data), 0
    try:
        while done < len(view):
            done += os.write(fd, view[done:])
    except OSError:
        if done:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
        raise


def temp_path(path: str) -> str:
    """The temporary name ``path`` is written under (same directory, so the rename is atomic)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.tmp-{os.getpid()}")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: str, path: str) -> None:
    """Make the closed file ``tmp`` durable and visible as ``path``."""
    _fsync(tmp)
    os.replace(tmp, path)
    _fsync(os.path.dirname(os.path.abspath(path)))


def discard(tmp: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w") -> Iterator[IO[Any]]:
    """``with atomic_open(path, "wb") as fh``: write ``fh``; ``path`` appears complete on success
    and is left untouched on an exception."""
    tmp = temp_path(path)
    os.makedirs(os.path.dirname(tmp), exist_ok=True)
    discard(tmp)                    # a leftover of this pid's, or something planted there: never written through
    try:
        with os.fdopen(os.open(tmp, NEW, 0o644), mode) as fh:
            yield fh
        commit(tmp, path)
    except BaseException:
        discard(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)
