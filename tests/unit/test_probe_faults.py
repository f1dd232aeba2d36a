"""scripts/probe-faults starts without launching anything: ``--list`` names every case of issue 23's
probe (and issue 37's, j-p), and a bad ``--only`` is refused with one line (the cases themselves are run by hand, see
docs/operations.md, "Probing the fault handling")."""
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "scripts", "probe-faults")


def probe(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_list_names_every_case():
    r = probe("--list")
    assert r.returncode == 0, r.stderr
    cases = [line.split()[:2] for line in r.stdout.splitlines()]
    assert cases == [["a", "same-run-dir"], ["b", "other-run-ckpt"], ["c", "sigstop"], ["d", "stop-signals"],
                     ["e", "kill9-resume"], ["f", "corrupt-ckpt"], ["g", "world-size"], ["h", "config-fuzz"],
                     ["i", "corrupt-shard"], ["j", "legs"], ["k", "all-corrupt"], ["l", "nan-test"],
                     ["m", "index-fields"], ["n", "limits"], ["o", "run-dir"], ["p", "unrecorded"],
                     ["q", "truncated-shard"], ["r", "metrics-unwritable"], ["s", "unloadable-ckpt"], ["t", "links"],
                     ["u", "fresh-start"], ["v", "immutable"], ["w", "prefetch"]]
    assert os.access(SCRIPT, os.X_OK)


def test_unknown_case_is_refused():
    r = probe("--only", "a,nosuch")
    assert r.returncode == 2 and "unknown case(s) nosuch" in r.stderr, r.stderr
