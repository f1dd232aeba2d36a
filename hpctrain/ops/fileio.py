"""Atomic file writes (the POSIX rename idiom): a reader sees the old file or the new one, never part.

Write a hidden temporary ``.NAME.tmp-PID`` in the same directory, fsync it, rename it over
``NAME``, fsync the directory (so the rename itself survives a crash). A writer that fails
removes its temporary; one that is killed leaves only the hidden temporary behind.
Used for shards and their index, checkpoints and the timeline.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import IO, Any


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
    try:
        with open(tmp, mode) as fh:
            yield fh
        commit(tmp, path)
    except BaseException:
        discard(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    with atomic_open(path, "w") as fh:
        fh.write(text)
