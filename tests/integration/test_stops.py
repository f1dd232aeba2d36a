"""Every stop ends as documented, with the default settings (parallel HDF5 ``mpio`` where h5py has
MPI): a stop signal writes a checkpoint and exits 3; resume and checkpoint-write errors exit 2;
each with one ``hpctrain:`` line and no traceback from any rank."""
import json
import os
import signal

import h5py
import pytest

from hpctrain.ops import checkpoint as ck
from tests.integration.inprocess import run_cli
from tests.integration.mpirun import hpctrain_lines as launched_lines
from tests.integration.mpirun import mpirun, rank_pids, start_training

ARGS = ["-m", "hpctrain", "--no-progress"]


def hpctrain_lines(stderr: str) -> list[str]:
    return launched_lines(stderr, "hpctrain:")


def assert_one_clean_line(stderr: str, expected: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = hpctrain_lines(stderr)
    assert len(lines) == 1 and expected in lines[0], lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_stop_signal_with_default_driver_checkpoints_and_exits_3(tmp_path, signum):
    """The signal a scheduler sends each task (scancel, --signal=USR1@T) reaches every rank."""
    proc = start_training(tmp_path, 2, "--epochs", "50")
    metrics = tmp_path / "metrics.jsonl"
    try:
        for pid in rank_pids(proc.pid):
            os.kill(pid, signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err[-3000:]
    assert_one_clean_line(err, f"stopped by {signal.Signals(signum).name} at step")
    events = [json.loads(x) for x in metrics.read_text().splitlines()]
    config, last = events[0], events[-1]
    assert last["event"] == "stopped" and last["signal"] == signal.Signals(signum).name
    if h5py.get_config().mpi:                               # the default really was parallel HDF5
        assert "driver='mpio'" in config["data"], config["data"]
    header, _ = ck.read_file(last["checkpoint"])            # written whole, checksum verifies
    assert header["step"] == last["step"]


def test_resume_of_a_missing_checkpoint_exits_2(tmp_path, capsys):
    r = run_cli(capsys, *ARGS[2:], "--run-dir", str(tmp_path), "--epochs", "1", "--resume", str(tmp_path / "none.pt"))
    assert r.returncode == 2, r.stderr[-3000:]
    assert_one_clean_line(r.stderr, f"checkpoint {tmp_path / 'none.pt'}: No such file or directory")


def test_resume_of_a_truncated_checkpoint_exits_2(tmp_path, capsys):
    r = run_cli(capsys, *ARGS[2:], "--run-dir", str(tmp_path / "a"), "--max-steps", "3")       # in process: one rank
    assert r.returncode == 0, r.stderr[-3000:]
    path = tmp_path / "a" / "checkpoints" / ck.checkpoint_name(3)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes()[:3000])
    r = run_cli(capsys, *ARGS[2:], "--run-dir", str(tmp_path / "b"), "--epochs", "1", "--resume", str(cut))
    assert r.returncode == 2, r.stderr[-3000:]
    assert_one_clean_line(r.stderr, f"checkpoint {cut}: truncated")


def test_checkpoint_that_cannot_be_written_exits_2(tmp_path):
    """The final checkpoint's name is taken by a directory: the rename fails (like a full disk, the
    error comes mid-run, after the data files were opened collectively)."""
    blocker = tmp_path / "checkpoints" / ck.checkpoint_name(4)
    blocker.mkdir(parents=True)
    (blocker / "keep").write_text("not a checkpoint")
    r, _ = mpirun(2, [*ARGS, "--run-dir", str(tmp_path), "--max-steps", "4"])
    assert r.returncode == 2, r.stderr[-3000:]
    assert_one_clean_line(r.stderr, f"checkpoint {blocker}: cannot write")
    assert (blocker / "keep").read_text() == "not a checkpoint"           # nothing of the user's lost
