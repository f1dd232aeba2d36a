"""Checkpoint file format: atomic write, SHA-256 verification, fallback, pruning, kill mid-write."""
import hashlib
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from hpctrain.ops import checkpoint as ck


def _write(directory, step, payload=None):
    payload = payload if payload is not None else os.urandom(1000 + step)
    path = os.path.join(directory, ck.checkpoint_name(step))
    ck.write_file(path, payload, {"step": step})
    return path, payload


def test_round_trip_and_independent_checksum(tmp_path):
    path, payload = _write(str(tmp_path), 7)
    header, got = ck.read_file(path)
    assert got == payload
    assert header["sha256"] == hashlib.sha256(payload).hexdigest()
    assert header["n_bytes"] == len(payload) and header["step"] == 7 and header["format"] == ck.FORMAT_VERSION
    raw = open(path, "rb").read()          # layout: magic, JSON line, payload
    assert raw.startswith(ck.MAGIC) and raw.endswith(payload)
    assert json.loads(raw[len(ck.MAGIC):].split(b"\n", 1)[0]) == header
    assert [n for n in os.listdir(tmp_path)] == [os.path.basename(path)]   # no temporary left


def test_corrupt_and_truncated_are_refused(tmp_path):
    path, payload = _write(str(tmp_path), 1)
    raw = bytearray(open(path, "rb").read())
    raw[-10] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    with pytest.raises(ck.CheckpointError, match="SHA-256 mismatch"):
        ck.read_file(path)
    open(path, "wb").write(bytes(raw[:-100]))
    with pytest.raises(ck.CheckpointError, match="truncated"):
        ck.read_file(path)
    open(path, "wb").write(b"garbage")
    with pytest.raises(ck.CheckpointError, match="not an hpctrain checkpoint"):
        ck.read_file(path)


def test_newest_valid_falls_back_past_a_corrupt_one(tmp_path):
    d = str(tmp_path)
    _write(d, 5)
    good, payload = _write(d, 10)
    bad, _ = _write(d, 15)
    with open(bad, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))
    warnings = []
    path, header, got = ck.newest_valid(d, warn=warnings.append)
    assert (path, header["step"], got) == (good, 10, payload)
    assert len(warnings) == 1 and "ckpt-000000015.pt" in warnings[0] and "SHA-256" in warnings[0]
    assert ck.newest_valid(str(tmp_path / "empty")) is None


def test_prune_keeps_newest_and_removes_temporaries(tmp_path):
    d = str(tmp_path)
    for s in (1, 2, 3, 4, 10):
        _write(d, s)
    stray = tmp_path / ".ckpt-000000011.pt.tmp-123"
    stray.write_bytes(b"partial")
    ck.prune(d, keep=2)
    assert [s for s, _ in ck.list_checkpoints(d)] == [4, 10]
    assert not stray.exists()


KILL_SCRIPT = """
import os, sys
from hpctrain.ops import checkpoint as ck
d = sys.argv[1]
ck.write_file(os.path.join(d, ck.checkpoint_name(1)), b"first" * 100000, {"step": 1})
ck.write_file(os.path.join(d, ck.checkpoint_name(2)), b"second" * 100000, {"step": 2})
print("not reached")
"""


def test_kill_during_write_leaves_previous_checkpoint_valid(tmp_path):
    env = {**os.environ, "HPCTRAIN_INJECT_KILL": "checkpoint:2"}
    r = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True)
    assert r.returncode == -9, r.stderr            # really SIGKILLed, half-way through file 2
    assert "not reached" not in r.stdout
    names = sorted(os.listdir(tmp_path))
    assert names[0].startswith(".ckpt-000000002.pt.tmp-") and names[1:] == [ck.checkpoint_name(1)]
    assert 0 < os.path.getsize(tmp_path / names[0]) < len(b"second" * 100000)
    path, header, payload = ck.newest_valid(str(tmp_path))
    assert header["step"] == 1 and payload == b"first" * 100000


def test_rng_state_round_trips_through_a_weights_only_payload():
    torch.manual_seed(3), np.random.seed(4), random.seed(5)
    state = ck.decode(ck.encode({"rng": [ck.rng_state()]}))["rng"][0]
    expect = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(99), np.random.seed(99), random.seed(99)
    ck.set_rng_state(state)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expect[0], got[0]) and np.array_equal(expect[1], got[1]) and expect[2] == got[2]


@pytest.mark.parametrize("epoch, sie, old_gb, spe, gb, expect", [
    (2, 5, 64, 28, 64, (2 * 28 + 5, 2, 5)),      # same plan: identity
    (2, 5, 64, 14, 128, (2 * 14 + 2, 2, 2)),     # doubled batch: 320 samples → 2 steps of 128
    (1, 27, 64, 56, 32, (56 + 54, 1, 54)),       # halved batch
    (0, 13, 128, 14, 64, (14, 1, 0)),            # lands on the epoch's end → next epoch
])
def test_replan(epoch, sie, old_gb, spe, gb, expect):
    pos = ck.replan(epoch, sie, old_gb, spe, gb)
    assert (pos.step, pos.epoch, pos.step_in_epoch) == expect
    assert pos.replanned == (old_gb != gb)
    assert pos.step_in_epoch * gb <= sie * old_gb          # never skips unseen samples of the epoch


# --- legs and corrupt checkpoints (issue 37) -----------------------------------------------------

def _write_leg(directory, step, leg, samples, run_id="r1"):
    path = os.path.join(directory, ck.checkpoint_name(step, leg))
    ck.write_file(path, os.urandom(64), {"step": step, "leg": leg, "samples_seen": samples, "run_id": run_id})
    return path


def test_newest_work_is_the_newest_leg_not_the_highest_step(tmp_path):
    """The issue's recipe: leg 0 reached step 44 at batch 64; leg 1 (batch 128) restarts at step
    22 and goes on to 25: leg 1's checkpoints hold the newest work, for resume and for pruning."""
    d = str(tmp_path)
    for s in (30, 40, 44):
        _write_leg(d, s, 0, 64 * s)
    leg1 = [_write_leg(d, s, 1, 64 * 44 + 128 * (s - 22)) for s in (23, 24, 25)]
    assert os.path.basename(leg1[0]) == "ckpt-000000023-leg1.pt"
    assert ck.newest_valid(d, run_id="r1")[0] == leg1[-1]
    assert ck.newest_work(d, "r1") == (1, os.path.abspath(leg1[-1]))
    ck.prune(d, keep=3, run_id="r1")
    assert [p for _, p in ck.list_checkpoints(d)] == leg1          # leg 0's pruned, never leg 1's


def _flip_last_byte(path):
    with open(path, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))


def test_a_corrupt_checkpoint_is_set_aside_and_never_pruned(tmp_path):
    d = str(tmp_path)
    good = _write_leg(d, 10, 0, 640)
    bad = _write_leg(d, 20, 0, 1280)
    _flip_last_byte(bad)
    raw = open(bad, "rb").read()
    warnings = []
    assert ck.newest_valid(d, warn=warnings.append, run_id="r1")[0] == good
    assert not os.path.exists(bad) and open(bad + ".corrupt", "rb").read() == raw     # kept, bytes untouched
    assert len(warnings) == 1 and "SHA-256 mismatch" in warnings[0] and f"kept as {bad}.corrupt" in warnings[0]
    for s in (30, 40, 50):
        _write_leg(d, s, 0, 64 * s)
    ck.prune(d, keep=1, run_id="r1")
    assert os.path.exists(bad + ".corrupt") and [s for s, _ in ck.list_checkpoints(d)] == [50]


def test_auto_refuses_when_no_checkpoint_of_the_run_verifies(tmp_path):
    d = str(tmp_path)
    paths = [_write_leg(d, s, 0, 64 * s) for s in (5, 10)]
    for p in paths:
        _flip_last_byte(p)
    msg = (r"no checkpoint of this run in .* verifies "
           r"\(set aside: ckpt-000000005.pt.corrupt, ckpt-000000010.pt.corrupt\)")
    with pytest.raises(ck.CheckpointError, match=msg):
        ck.newest_valid(d, run_id="r1")
    with pytest.raises(ck.CheckpointError, match=msg):         # and again: the refusal is not a one-off
        ck.newest_valid(d, run_id="r1")
    assert sorted(os.listdir(d)) == ["ckpt-000000005.pt.corrupt", "ckpt-000000010.pt.corrupt"]
    assert ck.newest_valid(d, run_id="another") is None       # a fresh run (--resume none) is not refused
    _write_leg(d, 10, 0, 640)                                  # same name again: the evidence is not overwritten
    _flip_last_byte(os.path.join(d, ck.checkpoint_name(10)))
    with pytest.raises(ck.CheckpointError):
        ck.newest_valid(d, run_id="r1")
    assert os.path.exists(os.path.join(d, "ckpt-000000010.pt.corrupt.1"))


def test_an_unreadable_header_is_not_pruned(tmp_path):
    d = str(tmp_path)
    junk = os.path.join(d, ck.checkpoint_name(1))
    open(junk, "wb").write(b"not a checkpoint")
    for s in (2, 3):
        _write_leg(d, s, 0, s)
    ck.prune(d, keep=1, run_id="r1")
    assert [s for s, _ in ck.list_checkpoints(d)] == [1, 3]


def test_resume_spec_none_is_a_fresh_start():
    assert ck.resume_spec("none") == ck.resume_spec("") == "" and ck.resume_spec("auto") == "auto"


def test_a_corrupt_checkpoint_that_cannot_be_renamed_still_refuses(tmp_path, monkeypatch):
    d = str(tmp_path)
    bad = _write_leg(d, 5, 0, 320)
    _flip_last_byte(bad)
    monkeypatch.setattr(os, "rename", lambda *a: (_ for _ in ()).throw(PermissionError(13, "read-only")))
    with pytest.raises(ck.CheckpointError, match=r"verifies \(set aside: ckpt-000000005.pt\)"):
        ck.newest_valid(d, run_id="r1")
    assert os.path.exists(bad)
