"""The CLI's training job (``python -m hpctrain``): the top of the house, the one package that
knows every part.

``config``: the schema (sections, ``--help``, TOML, ``--set``, validation), importing every
registry; ``setup``: the config read once into the library's plain keywords, and every part built;
``loop``: the epochs; ``results``: evaluation, Final Polishing, the summary; ``console``: the
start-up line and progress bar; ``runner``: :func:`run`, the phases in order.
"""
from hpctrain.job.runner import run

__all__ = ["run"]
