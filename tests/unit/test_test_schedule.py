"""The test-schedule log (``-p tests.schedule_log``) and its report (scripts/test-schedule)."""
import json
import os
import subprocess
import sys

from tests.scripts import ROOT, load_script

SAMPLE_TESTS = '''
import subprocess, sys, time

def test_sleeps():
    time.sleep(0.3)

BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass"

def test_child_burns_cpu():
    subprocess.run([sys.executable, "-c", BURN], check=True)
'''


def test_each_test_logs_its_wall_and_the_cpu_of_the_processes_it_waited_for(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE_TESTS)
    log = tmp_path / "schedule.jsonl"
    env = {**os.environ, "HPCTRAIN_TEST_SCHEDULE": str(log), "PYTHONPATH": ROOT}
    env.pop("PYTEST_XDIST_WORKER", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.schedule_log",
                        str(tmp_path / "test_sample.py")], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = {rec["test"].split("::")[1]: rec for rec in map(json.loads, log.read_text().splitlines())}
    assert set(recs) == {"test_sleeps", "test_child_burns_cpu"}
    sleep, burn = recs["test_sleeps"], recs["test_child_burns_cpu"]
    assert sleep["worker"] == "main" and sleep["end"] - sleep["start"] >= 0.3 and sleep["cpu"] < 0.2
    assert burn["cpu"] >= 0.4                  # the child's CPU, counted once it was waited for
    assert burn["start"] >= sleep["end"] or sleep["start"] >= burn["end"]


def test_without_the_variable_nothing_is_written(tmp_path):
    (tmp_path / "test_sample.py").write_text("def test_nothing():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "HPCTRAIN_TEST_SCHEDULE"}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.schedule_log",
                        "test_sample.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(os.listdir(tmp_path)) - {"__pycache__"} == {"test_sample.py"}


def test_report_counts_busy_and_idle_per_worker_and_the_cpu_share():
    recs = [  # two workers over 100 s: gw0 busy 0-60 (CPU 50), gw1 busy 0-30 and 50-100 (CPU 10 + 30)
        {"worker": "gw0", "test": "tests/a.py::t1", "start": 1000.0, "end": 1060.0, "cpu": 50.0},
        {"worker": "gw1", "test": "tests/b.py::t1", "start": 1000.0, "end": 1030.0, "cpu": 10.0},
        {"worker": "gw1", "test": "tests/b.py::t2", "start": 1050.0, "end": 1100.0, "cpu": 30.0},
    ]
    lines = load_script("test-schedule", "test_schedule").summary(recs, cores=2, top=5)
    assert lines[0] == "3 tests, wall 100 s, test CPU 90 s = 45 % of 2 cores over the wall"
    assert lines[1] == "  gw0: 1 tests, busy 60 s, done at +60 s, CPU 50 s"
    assert lines[2] == "  gw1: 2 tests, busy 80 s, done at +100 s, CPU 40 s"
    files = lines[lines.index("longest files (wall s, CPU s, CPU/wall, tests):") + 1:][:2]
    assert files[0].split() == ["80.0", "40.0", "0.50", "2", "tests/b.py"]
    assert files[1].split() == ["60.0", "50.0", "0.83", "1", "tests/a.py"]
    longest = lines[lines.index("longest tests (wall s, CPU s, CPU/wall, worker, start +s):") + 1]
    assert longest.split() == ["60.0", "50.0", "0.83", "gw0", "0", "tests/a.py::t1"]
