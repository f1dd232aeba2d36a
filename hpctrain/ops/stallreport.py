"""The watchdog's report: which ranks are behind, and where, from their progress values.

A rank's progress is ``step * SLOTS_PER_STEP + spans completed in the step``; every rank runs the
same phases in the same order, so the values compare across ranks and the report groups the ranks
by value: the furthest behind first, the ranks whose heartbeat has stopped named apart. Pure
functions of the values, so the wording is tested without MPI.
"""
from __future__ import annotations

SLOTS_PER_STEP = 64

__all__ = ["SLOTS_PER_STEP", "compress_ranks", "describe_stall"]


def compress_ranks(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` → ``"0-2, 5, 7-8"``."""
    out, ranks = [], sorted(ranks)
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out)


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {compress_ranks(ranks)}"


def describe_stall(values, phase_names: list[str], stalled_s: float, silent: dict[int, float] | None = None) -> str:
    """The report for progress ``values`` (one per rank); ``phase_names`` of a step, in order;
    ``silent``: {rank: seconds since its last heartbeat} of the ranks whose heartbeat has stopped."""
    values = [int(v) for v in values]
    lead, silent = max(values), silent or {}

    def where(v: int) -> str:
        step, k = divmod(v, SLOTS_PER_STEP)
        if k == 0:
            return f"at the start of step {step}"
        name = phase_names[k - 1] if k - 1 < len(phase_names) else f"phase {k}"
        return f"after '{name}' of step {step}"

    def are(rs: list[int]) -> str:
        return f"{_ranks(rs)} {'are' if len(rs) > 1 else 'is'}"

    groups: dict[int, list[int]] = {}
    for r, v in enumerate(values):
        groups.setdefault(v, []).append(r)
    if len(groups) == 1 and not silent:
        return (f"no progress for {stalled_s:.0f} s: all {len(values)} ranks are {where(lead)} "
                f"(a collective has not completed, or every rank is busy)")
    parts = []
    for v, rs in sorted(groups.items()):          # the furthest behind first; the silent named apart
        quiet = [r for r in rs if r in silent]
        if v != lead and len(quiet) < len(rs):
            parts.append(f"{are([r for r in rs if r not in silent])} {where(v)}")
        if quiet:
            parts.append(f"{are(quiet)} {where(v)}, silent for {min(silent[r] for r in quiet):.0f} s "
                         f"(stopped, or its node is down)")
    ahead = [r for r in groups[lead] if r not in silent]
    if ahead:
        parts.append(f"{_ranks(ahead)} {'wait' if len(ahead) > 1 else 'waits'} {where(lead)}")
    return f"no progress for {stalled_s:.0f} s: {'; '.join(parts)}"
