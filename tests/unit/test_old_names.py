"""Names renamed by issue 24 still work as aliases: the package ``hpctrain.sync`` (now
``hpctrain.update``) and its submodules, and ``ring.ring_allreduce`` (now ``allreduce_bucket``).
An alias must be the same object, not a copy: a second module would register every algorithm
twice, and a patch through one name would miss code using the other."""
import subprocess
import sys

import hpctrain.update
from hpctrain.comm import ring
from hpctrain.update import base, guard, odsgd, ssgd

OLD_FIRST = """
import sys
import hpctrain.sync.odsgd as old_odsgd          # the old name imported first, in a fresh process
from hpctrain.sync import SSGD, ALGORITHMS, create, algorithm_options, NonFiniteError
from hpctrain.sync.base import UpdateAlgorithm
from hpctrain.sync.guard import NonFiniteGuard
from hpctrain.sync.ssgd import MAX_WIRE_SKIPS
import hpctrain.update, hpctrain.update.odsgd, hpctrain.update.ssgd
assert old_odsgd is hpctrain.update.odsgd and SSGD is hpctrain.update.ssgd.SSGD
assert ALGORITHMS is hpctrain.update.base.ALGORITHMS and list(ALGORITHMS) == ["ssgd", "odsgd"]
names = sorted(m for m in sys.modules if m.startswith(("hpctrain.sync", "hpctrain.update")))
print(" ".join(names))
"""


def test_old_package_name_is_the_new_package():
    import hpctrain.sync
    import hpctrain.sync.odsgd
    from hpctrain.sync import ALGORITHMS, SSGD
    from hpctrain.sync.base import UpdateAlgorithm
    assert hpctrain.sync is hpctrain.update and hpctrain.sync.odsgd is odsgd
    assert ALGORITHMS is base.ALGORITHMS and SSGD is ssgd.SSGD and UpdateAlgorithm is base.UpdateAlgorithm
    for sub in (base, guard, odsgd, ssgd):
        assert sys.modules["hpctrain.sync." + sub.__name__.rpartition(".")[2]] is sub


def test_old_name_imported_first_loads_each_module_once():
    r = subprocess.run([sys.executable, "-c", OLD_FIRST], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["hpctrain.sync", "hpctrain.sync.base", "hpctrain.sync.guard", "hpctrain.sync.odsgd",
                                "hpctrain.sync.ssgd", "hpctrain.update", "hpctrain.update.base",
                                "hpctrain.update.guard", "hpctrain.update.odsgd", "hpctrain.update.ssgd"]


def test_ring_allreduce_is_allreduce_bucket():
    assert ring.ring_allreduce is ring.allreduce_bucket
