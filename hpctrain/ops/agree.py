"""Every rank agrees on an error: set-up problems stop the job with one line on every rank.

* :func:`agree` turns per-rank set-up errors (bad shard file, unimportable model) into the same
  :class:`~hpctrain.errors.UserError` on every rank, so the job stops with one clear line and no
  traceback.
* :func:`check_consistency` compares a fingerprint of the model, config and software on every
  rank at start-up and names the odd rank out (a stale module or config file on one node would
  otherwise surface as a hang or a truncation error inside the first broadcast).
"""
from __future__ import annotations

import hashlib
import sys
from collections import Counter

import numpy as np
from mpi4py import MPI

from hpctrain.errors import UserError


class ConsistencyError(UserError, ValueError):
    """Ranks disagree on model, config or software (same message on every rank; ``agree`` reports it)."""


class AgreedError(UserError, ValueError):
    """An error every rank already knows about (the exchange happened): :func:`agree` re-raises it
    as a :class:`UserError` without communicating again."""


def agree(comm: MPI.Comm, error: BaseException | str | None, error_type: type[UserError] = UserError) -> None:
    """Collective: if any rank has an error (an exception or its message), raise ``error_type``
    (a :class:`UserError`) on every rank.

    The message is the failing rank's own line; when ranks fail differently, the first one is
    named (``rank R: …``). Only ``str`` entries count as errors: :func:`check_consistency` sends
    tuples through the same allgather, so a rank that failed early still meets the others.
    """
    if isinstance(error, AgreedError):
        raise error_type(str(error))
    msgs = comm.allgather(None if error is None else str(error))
    bad = [(r, m) for r, m in enumerate(msgs) if isinstance(m, str)]
    if not bad:
        return
    if len({m for _, m in bad}) == 1 and len(bad) == len(msgs):
        raise error_type(bad[0][1])
    r, m = bad[0]
    raise error_type(f"rank {r}: {m}")


# --- start-up consistency -----------------------------------------------------------------------

def model_signature(model) -> list[str]:
    """One line per parameter/buffer: name, shape, dtype (values may differ before the broadcast)."""
    return [f"{name} {tuple(t.shape)} {t.dtype}" for name, t in model.state_dict().items()]


def config_signature(config: dict, software: dict | None = None) -> list[str]:
    """``section.key = value`` lines of a config dict, then the software versions."""
    lines = [f"{sec}.{key} = {value!r}" for sec, table in sorted(config.items())
             for key, value in sorted(table.items())]
    return lines + [f"version {name} = {v}" for name, v in sorted((software or {}).items())]


def software_versions() -> dict:
    import torch

    import hpctrain
    return {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
            "hpctrain": getattr(hpctrain, "__version__", "?"), "mpi": MPI.Get_library_version().split("\n")[0]}


def first_difference(ref: list[str], other: list[str]) -> str:
    """A short description of where two signatures part."""
    for a, b in zip(ref, other):
        if a != b:
            return f"{b!r} where the reference has {a!r}"
    if len(ref) != len(other):
        longer, n = (ref, len(other)) if len(ref) > len(other) else (other, len(ref))
        side = "missing" if longer is ref else "extra"
        return f"{side} {longer[n]!r} ({len(other)} entries vs {len(ref)})"
    return "same entries"


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def check_consistency(comm: MPI.Comm, model, config: dict, software: dict | None = None) -> None:
    """Collective: every rank must have built the same model from the same config and software.

    Raises the same :class:`ConsistencyError` on every rank naming the odd rank(s) out (the
    minority against the most common fingerprint; on a tie, against rank 0) and the first
    difference; pass it to :func:`agree` like any set-up error. Two 64-byte digests per rank cross
    the network; the full signatures only on a mismatch. Shares ``agree``'s wire format: if another
    rank already failed and is inside ``agree``, this exchange was that ``agree``, and the
    :class:`AgreedError` raised here makes the caller's own ``agree`` re-raise without a collective.
    """
    sigs = {"model": model_signature(model), "config": config_signature(config, software)}
    entries = comm.allgather(("fingerprint", _digest(sigs["model"]), _digest(sigs["config"])))
    for r, e in enumerate(entries):
        if isinstance(e, str):          # that rank failed earlier: this exchange was its agree()
            raise AgreedError(f"rank {r}: {e}")
    problems = []
    for i, what in enumerate(("model", "config")):
        digests = [e[1 + i] for e in entries]
        if len(set(digests)) == 1:
            continue
        counts = Counter(digests)
        best = max(counts.values())
        majority = digests[0] if counts[digests[0]] == best else next(d for d in digests if counts[d] == best)
        ref = digests.index(majority)
        odd = [r for r, d in enumerate(digests) if d != majority]
        mine = sigs[what]
        ref_lines = comm.bcast(mine if comm.Get_rank() == ref else None, root=ref)
        odd_lines = comm.bcast(mine if comm.Get_rank() == odd[0] else None, root=odd[0])
        problems.append(f"the {what} on rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} "
                        f"differs from rank {ref}'s: rank {odd[0]} has {first_difference(ref_lines, odd_lines)}")
    if problems:
        raise ConsistencyError("start-up check failed: " + "; ".join(problems)
                        + " (every rank must run the same code, config file and software)")
