"""A train shard truncated while a 2-rank job reads it through one reader per node (the default HDF5
driver: ``mpio`` where h5py has MPI, which reads zeros past the end): the status reaches the
launcher. The reads themselves, each driver and the rank reader: tests/unit/test_shard_changed_while_read.py."""
import json
import os
import subprocess
import sys
import time

from tests.integration.mpirun import ENV, MPIEXEC, hpctrain_lines
from tests.shard_files import convert_digits

SHARD = "train-00001-of-00004.h5"


def _epochs(run_dir) -> int:
    try:
        return sum('"event": "epoch"' in line for line in open(os.path.join(run_dir, "metrics.jsonl")))
    except OSError:
        return 0


def test_a_shard_truncated_mid_run_stops_the_job_with_status_2_and_one_line(tmp_path):
    data, run = convert_digits(tmp_path / "digits"), tmp_path / "run"
    argv = [MPIEXEC, "-n", "2", sys.executable, "-m", "hpctrain", "--run-dir", str(run), "--data", data,
            "--epochs", "400", "--no-progress", "--ranks-per-node", "2", "--set", "data.reader=node"]
    proc = subprocess.Popen(argv, env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 240
        while _epochs(run) < 1 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        os.truncate(os.path.join(data, SHARD), 15000)
        t_cut = time.monotonic()
        _, err = proc.communicate(timeout=120)
        secs = time.monotonic() - t_cut
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    errors = hpctrain_lines(err, "hpctrain: error:")
    assert proc.returncode == 2, err[-2000:]
    assert "Traceback" not in err and len(errors) == 1 and os.path.join(data, SHARD) in errors[0], err[-2000:]
    assert secs < 60, secs                              # stopped at once, not after the 400 epochs
    recs = [json.loads(x) for x in open(run / "metrics.jsonl")]
    assert not any(r["event"] == "summary" for r in recs)
    st = subprocess.run([sys.executable, "-m", "hpctrain", "status", "--wait", "10", str(run)],
                        capture_output=True, text=True, timeout=120)
    assert st.returncode == 2 and SHARD in st.stdout, st.stdout
