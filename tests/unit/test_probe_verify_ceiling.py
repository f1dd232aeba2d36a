"""scripts/probe-verify-ceiling (docs/data.md, "The ceiling"): every arrangement of the check gets a
row against the unchecked reads, its temporary file is gone afterwards, and a size below one run is
refused with one line. (The figures themselves are measured by hand; a unit test only times noise.)"""
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "scripts", "probe-verify-ceiling")
WAYS = ["unchecked: one pread per run", "pread per run, then XXH3 per block (hpctrain)", "pread + XXH3 per block",
        "pread + XXH3 in 1 MiB pieces", "pread + XXH3 in 256 KiB pieces", "XXH3 per block in a helper thread"]


def probe(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)


def test_every_way_gets_a_row_and_the_file_is_removed(tmp_path):
    r = probe("--mib", "40", "--rounds", "1", "--dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = {line[:46].strip(): line[46:].split() for line in r.stdout.splitlines()[2:]}
    assert list(rows) == WAYS + ["XXH3-128 alone, bytes in memory"]
    assert rows[WAYS[0]][1] == "100%"
    assert all(float(rows[w][0]) > 0 and rows[w][1].endswith("%") for w in WAYS)
    assert os.listdir(tmp_path) == []
    assert os.access(SCRIPT, os.X_OK)


def test_a_size_below_one_run_is_refused():
    r = probe("--mib", "8")
    assert r.returncode == 2 and "--mib must be at least 37" in r.stderr.splitlines()[-1], r.stderr
