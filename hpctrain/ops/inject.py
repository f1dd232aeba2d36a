"""Test hooks: inject a fault, a stall or a SIGKILL at a named point, chosen by environment
variables (``HPCTRAIN_INJECT_FAULT``, ``HPCTRAIN_INJECT_KILL``); no-ops when they are unset."""
from __future__ import annotations

import os
import signal
import time
from collections import Counter


def maybe_inject(rank: int, step: int) -> None:
    """Test hook: ``HPCTRAIN_INJECT_FAULT=RANK:STEP`` raises on that rank at that step;
    ``RANK:STEP:sleep=SECONDS`` stalls it instead (for the watchdog)."""
    spec = os.environ.get("HPCTRAIN_INJECT_FAULT")
    if spec:
        r, _, rest = spec.partition(":")
        s, _, action = rest.partition(":")
        if int(r) == rank and int(s or 0) == step:
            if action.startswith("sleep="):
                time.sleep(float(action[len("sleep="):]))
                return
            raise RuntimeError(f"injected fault (HPCTRAIN_INJECT_FAULT={spec})")


_kill_counts: Counter = Counter()


def maybe_kill(where: str) -> None:
    """Test hook: ``HPCTRAIN_INJECT_KILL=WHERE:N`` SIGKILLs this process the N-th time it passes
    ``where`` (e.g. ``checkpoint:2``: half-way through writing the second checkpoint)."""
    spec = os.environ.get("HPCTRAIN_INJECT_KILL")
    if not spec:
        return
    name, _, n = spec.partition(":")
    if name == where:
        _kill_counts[where] += 1
        if _kill_counts[where] == int(n or 1):
            os.kill(os.getpid(), signal.SIGKILL)
