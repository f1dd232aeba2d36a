"""The checkpoints of a directory: which holds the newest work, which may be pruned, which are corrupt.

Work, not step numbers, orders them. A run is a sequence of *legs*: a resume that changes the
global batch or the rank count (or continues from a checkpoint older than the newest leg) starts
a new leg, whose steps restart lower (``checkpoint.replan``). Each header carries its ``leg`` and
the ``samples_seen`` by the run up to it (every leg's samples), so the order is
``(leg, samples_seen, step)`` and ``resume=auto`` and pruning both take the newest leg's newest
checkpoint as the newest work. A header without them (older hpctrain) is leg 0, ordered by step.
Leg 0 keeps the name ``ckpt-<step>.pt``; leg L > 0 writes ``ckpt-<step>-leg<L>.pt``, so two legs
never write one name.

A checkpoint that fails verification is never deleted or written over: it is renamed
``<name>.corrupt`` (the evidence kept), and when no checkpoint of the run verifies, resuming
refuses with one line naming them instead of starting afresh (a fresh run directory or
``--resume none`` starts anew deliberately).
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from hpctrain.ops.ckptfile import CheckpointError, read_file, read_header

NAME_RE = re.compile(r"^ckpt-(\d+)(?:-leg(\d+))?\.pt$")
CORRUPT_SUFFIX = ".corrupt"
CORRUPT_RE = re.compile(r"^ckpt-\d+(?:-leg\d+)?\.pt\.corrupt(?:\.\d+)?$")


def checkpoint_name(step: int, leg: int = 0) -> str:
    return f"ckpt-{step:09d}.pt" if not leg else f"ckpt-{step:09d}-leg{leg}.pt"


@dataclass(frozen=True)
class Entry:
    """One checkpoint file and what its header says about the work it holds."""
    path: str
    step: int
    leg: int
    samples_seen: int
    run_id: str | None
    readable: bool          # the header could be read (None of its fields trusted otherwise)

    @property
    def key(self) -> tuple[int, int, int]:
        return self.leg, self.samples_seen, self.step


def _count(header: dict, key: str, default: int) -> int:
    v = header.get(key, default)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default


def entry(path: str, step: int) -> Entry:
    header = read_header(path)
    if header is None:
        return Entry(path, step, 0, step, None, False)
    rid = header.get("run_id")
    return Entry(path, step, _count(header, "leg", 0), _count(header, "samples_seen", step),
                 rid if isinstance(rid, str) else None, True)


def entries(directory: str) -> list[Entry]:
    """Every checkpoint in ``directory``, oldest work first."""
    if not os.path.isdir(directory):
        return []
    found = [entry(os.path.join(directory, name), int(m.group(1)))
             for name in os.listdir(directory) if (m := NAME_RE.match(name))]
    return sorted(found, key=lambda e: (e.key, e.path))


def of_run(path: str, run_id: str | None) -> bool:
    """Whether the checkpoint at ``path`` belongs to run ``run_id`` (None: any run). A checkpoint
    whose header cannot be read, or written before checkpoints carried a run id, counts as this
    run's (reading it then verifies it, or warns)."""
    if run_id is None:
        return True
    header = read_header(path)
    return header is None or header.get("run_id") in (None, run_id)


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every checkpoint in ``directory``, oldest work first."""
    return [(e.step, e.path) for e in entries(directory)]


def newest_work(directory: str, run_id: str | None) -> tuple[int, str] | None:
    """``(leg, path)`` of run ``run_id``'s readable checkpoint holding the newest work (its leg is
    the run's highest), or None if it has none here."""
    mine = [e for e in entries(directory) if e.readable and of_run(e.path, run_id)]
    return (mine[-1].leg, os.path.abspath(mine[-1].path)) if mine else None


def corrupt_files(directory: str, run_id: str | None = None) -> list[str]:
    """Checkpoints of run ``run_id`` (an unreadable header counts as its) set aside as corrupt."""
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if CORRUPT_RE.match(n) and of_run(os.path.join(directory, n), run_id))


def set_aside(path: str) -> str:
    """Rename a checkpoint that failed verification to ``<path>.corrupt`` (``.corrupt.1``… if
    taken: evidence is never written over); returns the new name, or ``path`` if it cannot move."""
    target, n = path + CORRUPT_SUFFIX, 0
    while os.path.lexists(target):
        n += 1
        target = f"{path}{CORRUPT_SUFFIX}.{n}"
    try:
        os.rename(path, target)
    except OSError:
        return path
    return target


def newest_valid(directory: str, warn=None, run_id: str | None = None,
                 check: Callable[[str, bytes], object] | None = None) -> tuple[str, dict, bytes] | None:
    """The checkpoint of run ``run_id`` (None: any) holding the newest work that verifies, or None
    if the run has none. Each one that fails verification — its digest, then ``check(path,
    payload)`` if given (raising :class:`CheckpointError`: :func:`~hpctrain.ops.ckptfile.load`)
    — is set aside (:func:`set_aside`, with ``warn(msg)``). Raises :class:`CheckpointError` when
    none of this run's verifies but some failed (now or on an earlier try): starting afresh would
    silently discard that work; or when there is none of this run's but another run's: continuing
    from those would be its weights.
    The warnings are given only when a checkpoint is found: a refusal is one line."""
    foreign, warnings, unmoved = None, [], []
    for e in reversed(entries(directory)):
        if not of_run(e.path, run_id):
            foreign = foreign or e.path
            continue
        try:
            header, payload = read_file(e.path)
            if check is not None:
                check(e.path, payload)
        except CheckpointError as exc:
            kept = set_aside(e.path)
            where = f"kept as {kept}" if kept != e.path else "could not be renamed; left in place"
            if kept == e.path:
                unmoved.append(e.path)
            warnings.append(f"{exc}; {where}; falling back to the previous checkpoint")
            continue
        for line in warnings if warn else ():
            warn(line)
        return e.path, header, payload
    corrupt = corrupt_files(directory, run_id) + unmoved    # none verifies: the refusal's one line names them all
    if corrupt:
        raise CheckpointError(f"no checkpoint of this run in {directory} verifies (set aside: "
                              f"{', '.join(os.path.basename(p) for p in corrupt)}): refusing to start "
                              f"afresh over them; repair or resume one by path, or start anew with "
                              f"--resume none or a fresh --run-dir")
    if foreign:
        other = (read_header(foreign) or {}).get("run_id")    # None: gone or unreadable since of_run
        who = f"run {other}" if other else "another run"
        raise CheckpointError(f"checkpoint {foreign} belongs to {who}, not to "
                              f"this run ({run_id}) and this run has none: resume it by path "
                              f"(--resume {foreign}) or start afresh (--resume none)")
    return None


def prune(directory: str, keep: int, run_id: str | None = None) -> list[str]:
    """Delete all but the ``keep`` checkpoints of run ``run_id`` holding the newest work (None: any
    run; another run's are never deleted) and stray temporary files; returns deleted paths. A
    checkpoint whose header cannot be read is not deleted (resuming verifies it and sets it aside),
    nor is anything set aside as corrupt."""
    mine = [e.path for e in entries(directory) if e.readable and of_run(e.path, run_id)]
    doomed = mine[:-keep] if keep > 0 else mine
    doomed += [os.path.join(directory, n) for n in os.listdir(directory) if n.startswith(".ckpt-") and ".tmp-" in n]
    for p in doomed:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return doomed
