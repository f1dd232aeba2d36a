"""Every file the job writes in its run directory is whole or absent, never written through a link,
and an earlier run's history is never dropped; a file that cannot be written is one line."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
from mpi4py import MPI

from hpctrain.ops import report, runstate
from hpctrain.ops.fileio import WriteError, atomic_write_text, temp_path
from hpctrain.ops.metrics import MetricsLog, read_records
from hpctrain.ops.rundir import RunDirectory
from hpctrain.ops.rundircheck import RunDirError, run_dir_problem
from hpctrain.ops.runlock import RunDirBusy, hold_run_dirs
from hpctrain.ops.timeline import write_trace


def _lines(path):
    return open(path).read().splitlines()


def _history(run_dir, n=3, run_id="r1"):
    log = MetricsLog(str(run_dir), enabled=True)
    log.log("config", run_id=run_id, config={"train": {"batch_size": 32}}, world_size=1)
    for e in range(n - 1):
        log.log("epoch", epoch=e, step=10 * (e + 1), train_loss=1.0 / (e + 1), wall_s=1.0, steps=10)
    log.close()
    return open(run_dir / "metrics.jsonl", "rb").read()


@pytest.fixture
def chattr(tmp_path):
    """``chattr(path, "+i")`` (root on a file system that keeps inode flags); undone in teardown."""
    probe = tmp_path / ".probe"
    probe.write_text("x")
    if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here (not root, or the file system keeps no inode flags)")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    done = []

    def set_(path, flag):
        subprocess.run(["chattr", flag, str(path)], check=True)
        done.append(path)
    yield set_
    for path in done:
        subprocess.run(["chattr", "-i", "-a", str(path)], capture_output=True)


APPEND_OVER_LIMIT = textwrap.dedent("""
    import resource, sys
    from hpctrain.ops.metrics import MetricsLog
    from hpctrain.ops.fileio import WriteError
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))   # Python ignores SIGXFSZ: the write gets EFBIG
    log = MetricsLog(sys.argv[1], enabled=True, append=True)
    try:
        log.log("epoch", epoch=9, note="x" * 5000)
    except WriteError as exc:
        print(exc)
        sys.exit(2)
""")


def test_a_full_disk_during_an_append_leaves_no_half_line(tmp_path):
    before = _history(tmp_path)
    r = subprocess.run([sys.executable, "-c", APPEND_OVER_LIMIT, str(tmp_path), str(len(before) + 1000)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert str(tmp_path / "metrics.jsonl") in r.stdout and "File too large" in r.stdout and not r.stderr
    assert open(tmp_path / "metrics.jsonl", "rb").read() == before          # cut back: nothing torn, nothing lost


def test_an_immutable_metrics_file_mid_run_is_one_line_and_the_file_stays_whole(tmp_path, chattr):
    before = _history(tmp_path)
    log = MetricsLog(str(tmp_path), enabled=True, append=True)
    chattr(tmp_path / "metrics.jsonl", "+i")
    with pytest.raises(WriteError, match=r"metrics\.jsonl: cannot write: Operation not permitted"):
        log.log("epoch", epoch=5)
    log.log("epoch", epoch=6)                   # closed after the failure: nothing more tried
    assert open(tmp_path / "metrics.jsonl", "rb").read() == before


def test_report_and_resume_read_a_torn_last_line(tmp_path, capsys):
    before = _history(tmp_path)
    with open(tmp_path / "metrics.jsonl", "ab") as fh:        # an older hpctrain cut off mid-line
        fh.write(b'{"event": "epoch", "epoch": 2, "train_lo')
    atomic_write_text(str(tmp_path / "state.json"), json.dumps({"state": "stopped", "step": 3}))
    run = report.load_run(str(tmp_path))
    assert [e["epoch"] for e in run.epochs] == [0, 1] and "skipped 1 line(s)" in run.skipped
    assert report.main([str(tmp_path), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "line 4" in err
    assert runstate.main([str(tmp_path)]) == 3
    log = MetricsLog(str(tmp_path), enabled=True, append=True)      # a resume continues on a line of its own
    log.log("epoch", epoch=2, train_loss=0.3)
    log.close()
    assert [r.get("epoch") for r in read_records(str(tmp_path))] == [None, 0, 1, 2]
    assert open(tmp_path / "metrics.jsonl", "rb").read().startswith(before)


def test_a_fresh_start_keeps_the_earlier_history(tmp_path, capsys):
    before = _history(tmp_path, run_id="abc123")
    log = MetricsLog(str(tmp_path), enabled=True, append=False)
    log.log("config", run_id="new")
    log.close()
    assert open(tmp_path / "metrics-abc123.jsonl", "rb").read() == before
    assert [r["run_id"] for r in read_records(str(tmp_path))] == ["new"]
    assert "kept as" in capsys.readouterr().err
    MetricsLog(str(tmp_path), enabled=True, append=False).close()     # again: a new name, nothing written over
    assert open(tmp_path / "metrics-new.jsonl").read().count("\n") == 1
    assert open(tmp_path / "metrics-abc123.jsonl", "rb").read() == before


@pytest.mark.parametrize("name", ["metrics.jsonl", "state.json", "run_id", "timeline.json", ".lock"])
def test_a_link_planted_in_the_run_directory_is_refused_and_its_target_untouched(tmp_path, name):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(victim, run / name)
    problem = run_dir_problem(str(run), str(run / "checkpoints"))
    if name == ".lock":                     # taken before the check: the lock itself refuses the link
        with pytest.raises(RunDirBusy, match=r"\.lock is a symbolic link"):
            with hold_run_dirs(MPI.COMM_SELF, [str(run)]):
                pass
    else:
        assert problem == (f"{run / name} is a symbolic link: hpctrain does not write through links in a run "
                           f"directory; remove it or choose another --run-dir")
        with pytest.raises(RunDirError, match="symbolic link"):
            with RunDirectory(MPI.COMM_SELF, str(run)):
                pass
    assert victim.read_text() == "precious\n"


def test_writers_never_follow_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "metrics.jsonl")
    with pytest.raises(WriteError, match=r"metrics\.jsonl is a symbolic link"):
        MetricsLog(str(tmp_path), enabled=True, append=True)
    os.symlink(victim, tmp_path / "state.json")
    os.symlink(victim, temp_path(str(tmp_path / "state.json")))      # even at the temporary's name
    runstate.record(str(tmp_path), "running")                       # the link is replaced, not written through
    assert not os.path.islink(tmp_path / "state.json") and runstate.read(str(tmp_path))["state"] == "running"
    assert victim.read_text() == "precious\n"


def test_an_immutable_state_file_is_one_line_at_start_and_at_the_end(tmp_path, chattr):
    runstate.record(str(tmp_path), "done")
    chattr(tmp_path / "state.json", "+i")
    with pytest.raises(RunDirError, match=r"state\.json is immutable \(chattr\): it cannot be replaced"):
        with RunDirectory(MPI.COMM_SELF, str(tmp_path)):
            pass
    with pytest.raises(WriteError, match=r"state\.json: cannot write: Operation not permitted"):
        runstate.record(str(tmp_path), "stopped")


@pytest.mark.parametrize("name", ["run_id", "timeline.json"])
def test_any_replaced_file_that_cannot_be_replaced_is_found_at_start(tmp_path, chattr, name):
    (tmp_path / name).write_text("old\n")
    chattr(tmp_path / name, "+a")
    assert f"{name} is append-only" in run_dir_problem(str(tmp_path), str(tmp_path / "checkpoints"))


def test_a_timeline_that_cannot_be_written_is_one_line(tmp_path, chattr):
    (tmp_path / "timeline.json").write_text("{}")
    chattr(tmp_path / "timeline.json", "+i")
    with pytest.raises(WriteError, match=r"timeline\.json: cannot write"):
        write_trace(str(tmp_path / "timeline.json"), [(0, "rank 0", [], b"", b"", b"", 0)])
    assert (tmp_path / "timeline.json").read_text() == "{}"


def test_a_hostile_run_id_in_the_history_names_no_path(tmp_path):
    _history(tmp_path, run_id="../../escape")
    MetricsLog(str(tmp_path), enabled=True, append=False).close()
    assert sorted(os.listdir(tmp_path)) == ["metrics-earlier.jsonl", "metrics.jsonl"]
