"""Every source reader, registered: import this module to fill :data:`SOURCES` (the one list of
reader modules; each registers itself with ``@source("NAME")`` from :mod:`hpctrain.data_tools.sources`,
which imports none of them, so there is no import loop). A new reader is one module plus one
line here."""
from __future__ import annotations

from . import cifar, idx, imagefolder, synthetic  # noqa: F401  (each registers its readers)
from .sources import SOURCES

__all__ = ["SOURCES"]
