"""hpctrain: MPI-native data-parallel deep-learning training for supercomputers.

Nothing here imports MPI or torch at import time beyond what a submodule needs; the public
API is re-exported lazily so `python -m hpctrain --help` stays fast.
"""
__version__ = "0.1.0"
__all__ = ["__version__"]
