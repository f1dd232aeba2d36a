"""The old name of :mod:`hpctrain.update` (the update algorithms), kept so existing imports work.

``import hpctrain.sync``, ``from hpctrain.sync import SSGD`` and ``from hpctrain.sync.odsgd import
...`` give the very module objects of ``hpctrain.update`` (not copies): one ``ALGORITHMS``
registry, one class per algorithm, and a patch made through either name is seen through both.
The package was renamed because ``trainer.sync`` is the gradient sync (a ``GradSync``), not an
update algorithm. New code imports ``hpctrain.update``.
"""
import sys

from hpctrain import update
from hpctrain.update import base, guard, odsgd, ssgd

for _sub in (base, guard, odsgd, ssgd):
    sys.modules[f"{__name__}.{_sub.__name__.rpartition('.')[2]}"] = _sub
sys.modules[__name__] = update
