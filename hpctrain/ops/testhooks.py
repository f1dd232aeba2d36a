"""Every switch the tests turn in production code, in one place; each is a no-op when unset.

Environment variables (read where noted; set by tests, by ``scripts/probe-faults`` and by
anyone reproducing a fault by hand):

* ``HPCTRAIN_INJECT_FAULT=RANK:STEP[:sleep=S]``: raise (or stall S seconds) on that rank at that
  step (:func:`maybe_inject`, every training step);
* ``HPCTRAIN_INJECT_KILL=WHERE:N``: SIGKILL this process the N-th time it passes ``WHERE``
  (:func:`maybe_kill`, e.g. ``checkpoint:2``);
* ``HPCTRAIN_TEST_STAGING=1``: CPU gradient buckets take the GPU's staging path (read when the
  buckets are made: :func:`staging_forced`);
* ``HPCTRAIN_TEST_DEVICE_BATCHES=1``: the CPU job takes the GPU's data path, raw batches prepared
  after the copy (:func:`device_batches_forced`);
* ``HPCTRAIN_CLUSTER_INJECT_FAULT=fail:K`` or ``hang:K``: ``cluster up`` fails (or hangs 60 s)
  once node K of the emulated cluster is built, to test its cleanup (:func:`cluster_fault`, read
  by :mod:`hpctrain.tools.cluster.netns` after each node).

One seam is not an environment variable: ``hpctrain.comm.ring.AS_TENSOR``, the device types
whose buffers go to MPI as tensors, which tests monkeypatch to include ``"cpu"``.
"""
from __future__ import annotations

import os
import signal
import time
from collections import Counter


def maybe_inject(rank: int, step: int) -> None:
    """Test hook: ``HPCTRAIN_INJECT_FAULT=RANK:STEP`` raises on that rank at that step;
    ``RANK:STEP:sleep=SECONDS`` stalls it instead (for the watchdog)."""
    spec = os.environ.get(INJECT_FAULT)
    if spec:
        r, _, rest = spec.partition(":")
        s, _, action = rest.partition(":")
        if int(r) == rank and int(s or 0) == step:
            if action.startswith("sleep="):
                time.sleep(float(action[len("sleep="):]))
                return
            raise RuntimeError(f"injected fault (HPCTRAIN_INJECT_FAULT={spec})")


INJECT_FAULT = "HPCTRAIN_INJECT_FAULT"
INJECT_KILL = "HPCTRAIN_INJECT_KILL"
TEST_STAGING = "HPCTRAIN_TEST_STAGING"
TEST_DEVICE_BATCHES = "HPCTRAIN_TEST_DEVICE_BATCHES"
CLUSTER_INJECT_FAULT = "HPCTRAIN_CLUSTER_INJECT_FAULT"


def staging_forced() -> bool:
    """Do the tests ask CPU buckets to take the device (staging) path?"""
    return os.environ.get(TEST_STAGING, "") == "1"


def device_batches_forced() -> bool:
    """Do the tests ask the CPU job to take the GPU's data path?"""
    return os.environ.get(TEST_DEVICE_BATCHES) == "1"


def cluster_fault(node: int) -> str | None:
    """The fault ``HPCTRAIN_CLUSTER_INJECT_FAULT=KIND:K`` asks for once node ``node`` of an
    emulated cluster is built (``KIND``: ``fail`` or ``hang``), or None (unset, another node)."""
    kind, _, at = os.environ.get(CLUSTER_INJECT_FAULT, "").partition(":")
    return kind if kind and at and int(at) == node else None


_kill_counts: Counter = Counter()


def maybe_kill(where: str) -> None:
    """Test hook: ``HPCTRAIN_INJECT_KILL=WHERE:N`` SIGKILLs this process the N-th time it passes
    ``where`` (e.g. ``checkpoint:2``: half-way through writing the second checkpoint)."""
    spec = os.environ.get(INJECT_KILL)
    if not spec:
        return
    name, _, n = spec.partition(":")
    if name == where:
        _kill_counts[where] += 1
        if _kill_counts[where] == int(n or 1):
            os.kill(os.getpid(), signal.SIGKILL)
