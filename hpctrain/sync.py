"""The old name of :mod:`hpctrain.update` (the update algorithms), kept so existing imports work.

``import hpctrain.sync``, ``from hpctrain.sync import SSGD`` and ``from hpctrain.sync.odsgd import
...`` give the very module objects of ``hpctrain.update`` (not copies, :mod:`hpctrain.bare_names`):
one ``ALGORITHMS`` registry, one class per algorithm, and a patch made through either name is seen
through both. The package was renamed because ``trainer.sync`` is the gradient sync (a
``GradSync``), not an update algorithm. New code imports ``hpctrain.update``.
"""
from hpctrain.bare_names import become

become(__name__, "hpctrain.update")
