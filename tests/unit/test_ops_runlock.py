"""One job per run directory (flock on RUN_DIR/.lock) and one run per checkpoint series (run id)."""
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from mpi4py import MPI

from hpctrain.ops import checkpoint as ck
from hpctrain.ops import ckptdir
from hpctrain.ops.runlock import LOCK_NAME, RunDirBusy, RunLock, held_run_dir, hold_run_dirs, run_identity


def test_second_holder_is_refused_naming_the_first(tmp_path):
    first = RunLock(str(tmp_path))
    first.acquire()
    try:
        record = json.loads((tmp_path / LOCK_NAME).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        second = RunLock(str(tmp_path))        # its own open file description: flock conflicts
        with pytest.raises(RunDirBusy, match=rf"in use by pid {os.getpid()} on host {socket.gethostname()} "
                                             rf"since {record['start']} \(lock {tmp_path}/{LOCK_NAME}\)"):
            second.acquire()
        assert json.loads((tmp_path / LOCK_NAME).read_text()) == record      # the refused one wrote nothing
        assert second.holder().startswith(f"pid {os.getpid()}")
    finally:
        first.release()
    assert RunLock(str(tmp_path)).holder() is None
    again = RunLock(str(tmp_path))               # released: free for the next job
    again.acquire()
    again.release()


def test_a_look_does_not_refuse_a_job_taking_the_lock(tmp_path):
    """holder() (the early look, `hpctrain status`) holds a shared lock for an instant: a job
    acquiring in that instant tries again instead of reporting the directory in use."""
    (tmp_path / LOCK_NAME).write_text("")
    look = os.open(tmp_path / LOCK_NAME, os.O_RDONLY)
    fcntl.flock(look, fcntl.LOCK_SH | fcntl.LOCK_NB)
    t0 = time.monotonic()
    threading.Timer(0.02, os.close, (look,)).start()
    lock = RunLock(str(tmp_path))
    lock.acquire()                                             # RunDirBusy here is the bug
    try:
        assert time.monotonic() - t0 >= 0.02                  # it waited for the look to end ...
        assert RunLock(str(tmp_path)).holder().startswith(f"pid {os.getpid()}")   # ... then held the lock
    finally:
        lock.release()


def test_second_job_is_refused_before_mpi_and_torch_are_loaded(tmp_path):
    """The cheap look in `python -m hpctrain`: status 2 and the holder's line before the heavy
    imports (what is in sys.modules when main returns), here as a singleton without a launcher."""
    held = RunLock(str(tmp_path / "run"))
    held.acquire()
    code = ("import sys\nfrom hpctrain.cli import main\nrc = main(sys.argv[1:])\n"
            "print(rc, [m for m in ('torch', 'mpi4py.MPI') if m in sys.modules])\n")
    try:
        r = subprocess.run([sys.executable, "-c", code, "--run-dir", str(tmp_path / "run"), "--no-progress"],
                           capture_output=True, text=True, timeout=120)
        line = held_run_dir([str(tmp_path / "run")])
    finally:
        held.release()
    assert r.stdout == "2 []\n", (r.stdout, r.stderr[-2000:])
    assert r.stderr.splitlines() == [f"hpctrain: error: {line}"]
    assert line.startswith(f"run directory {tmp_path / 'run'} is in use by pid {os.getpid()} on host ")
    assert held_run_dir([str(tmp_path / "run")]) is None                  # released: no refusal
    (tmp_path / "a-file").write_text("")
    assert held_run_dir([str(tmp_path / "not-made-yet"), str(tmp_path / "a-file")]) is None   # left to validate()


def test_hold_run_dirs_releases_on_an_exception(tmp_path):
    with pytest.raises(ValueError):
        with hold_run_dirs(MPI.COMM_SELF, [str(tmp_path / "run"), str(tmp_path / "ckpt")]):
            assert RunLock(str(tmp_path / "ckpt")).holder() is not None
            raise ValueError("boom")
    assert RunLock(str(tmp_path / "run")).holder() is None and RunLock(str(tmp_path / "ckpt")).holder() is None


def test_run_identity_is_kept_by_a_resume_and_renewed_by_a_fresh_start(tmp_path):
    a = run_identity(MPI.COMM_SELF, str(tmp_path), fresh=True)
    assert run_identity(MPI.COMM_SELF, str(tmp_path), fresh=False) == a
    b = run_identity(MPI.COMM_SELF, str(tmp_path), fresh=True)
    assert b != a and (tmp_path / "run_id").read_text().strip() == b


def _write(directory, step, run_id):
    meta = {"step": step} if run_id is None else {"step": step, "run_id": run_id}
    ck.write_file(os.path.join(directory, ck.checkpoint_name(step)), os.urandom(100), meta)


def test_auto_takes_only_this_runs_checkpoints_and_refuses_another_runs(tmp_path):
    d = str(tmp_path)
    for step in (10, 20, 30):
        _write(d, step, "aaaa")                  # an earlier run in this directory, further on
    _write(d, 2, "bbbb")
    assert ck.newest_valid(d, run_id="bbbb")[0].endswith(ck.checkpoint_name(2))
    assert ck.newest_valid(d)[0].endswith(ck.checkpoint_name(30))           # no run id: any (as before)
    with pytest.raises(ck.CheckpointError, match=rf"checkpoint {d}/{ck.checkpoint_name(30)} belongs to run "
                                                 r"aaaa, not to this run \(cccc\)"):
        ck.newest_valid(d, run_id="cccc")
    _write(d, 1, None)                           # written before checkpoints carried a run id
    assert ck.newest_valid(d, run_id="cccc")[0].endswith(ck.checkpoint_name(1))


def test_refusal_survives_the_other_runs_checkpoint_vanishing(tmp_path, monkeypatch):
    """The refusal reads the other run's header again for its message: a checkpoint deleted in
    between (that run's prune) still gives the one-line CheckpointError (was an AttributeError)."""
    d = str(tmp_path)
    _write(d, 30, "aaaa")
    real_of_run = ckptdir.of_run

    def of_run_then_deleted(path, run_id):
        verdict = real_of_run(path, run_id)
        os.unlink(path)
        return verdict
    monkeypatch.setattr(ckptdir, "of_run", of_run_then_deleted)
    with pytest.raises(ck.CheckpointError, match=rf"checkpoint {d}/{ck.checkpoint_name(30)} belongs to another "
                                                 r"run, not to this run \(cccc\)"):
        ck.newest_valid(d, run_id="cccc")


def test_prune_leaves_another_runs_checkpoints(tmp_path):
    d = str(tmp_path)
    for step in (10, 20):
        _write(d, step, "aaaa")
    for step in (1, 2, 3):
        _write(d, step, "bbbb")
    ck.prune(d, keep=2, run_id="bbbb")
    assert [s for s, _ in ck.list_checkpoints(d)] == [2, 3, 10, 20]
