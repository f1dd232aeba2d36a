"""``scripts/machine-busy``: the command's status comes back, and a command that spins counts
at least its own CPU time (the machine's other work can only add to the figure)."""
import os
import re
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "scripts", "machine-busy")
SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\nraise SystemExit(3)"


def test_a_spinning_command_counts_its_cpu_and_keeps_its_status():
    r = subprocess.run([sys.executable, SCRIPT, sys.executable, "-c", SPIN], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3, r.stderr
    m = re.search(r"wall ([\d.]+) s, busy ([\d.]+) core-s = \d+ % of \d+ cores, status 3$", r.stderr.strip())
    assert m, r.stderr
    wall, busy = map(float, m.groups())
    assert busy >= 0.5 and wall >= 0.55, (wall, busy)
