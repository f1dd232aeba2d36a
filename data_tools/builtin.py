"""Built-in datasets, converted to shards in a cache directory on first use; a data-source plugin
that needs no input file (``data.dataset = "package.module:name"``, registered in
:data:`hpctrain.data_tools.sources.SOURCES` as ``hpctrain-data convert --from`` takes it) likewise,
into ``CACHE_DIR/plugin-package.module.name`` (delete it to convert again after changing the plugin).

Here, not in :mod:`hpctrain.data`: converting is the tools' work (the loader only reads shards and
never imports the tools); the job calls :func:`resolve_dataset` before it opens the loader.

Rank 0 checks a plugin and converts (into a temporary directory renamed into place, so concurrent
jobs and killed conversions never leave a half-written dataset) and broadcasts the outcome; nothing
else is sent.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from mpi4py import MPI

from hpctrain.config.values import is_plugin_spec
from hpctrain.errors import ConfigError, UserError

from .readers import SOURCES
from .writer import convert

BUILTIN_DATASETS = {"digits": "digits-v1", "signal1d": "signal1d-v1", "tabular": "tabular-v1",
                    "spirals": "spirals-v1", "pulses": "pulses-v1"}


def dataset_problem(dataset: str) -> str | None:
    """Why ``package.module:name`` selects no data source (the module does not import, or registers
    no such source), or None; None for a built-in name or a directory too."""
    return SOURCES.plugin_problem(dataset) if is_plugin_spec(dataset) else None


def resolve_dataset(dataset: str, cache_dir: str, comm: MPI.Comm) -> str:
    """Return the shard directory for ``dataset`` (a built-in name, a ``module:name`` data-source
    plugin, or a directory). Collective. A plugin that selects nothing raises :class:`ConfigError`
    (``config data.dataset: ...``) on every rank, a failed conversion :class:`UserError`."""
    if dataset in BUILTIN_DATASETS:
        name = BUILTIN_DATASETS[dataset]
    elif is_plugin_spec(dataset):
        name = "plugin-" + dataset.replace(":", ".")
    else:
        return dataset
    path = os.path.join(os.path.expanduser(cache_dir), name)
    error = None
    if comm.Get_rank() == 0:
        problem = dataset_problem(dataset)
        if problem:
            error = ("config", f"config data.dataset: {problem}")
        elif not os.path.exists(os.path.join(path, "index.json")):
            try:
                _convert(dataset, path)
            except Exception as exc:  # reported on every rank by the bcast below
                kind = "built-in dataset" if dataset in BUILTIN_DATASETS else "dataset"
                error = ("convert", f"converting {kind} {dataset!r} into {path}: {exc}")
    error = comm.bcast(error, root=0)
    if error:                        # the same line on every rank (rank 0's traceback is not kept)
        raise (ConfigError if error[0] == "config" else UserError)(error[1])
    return path


def _convert(dataset: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        convert(SOURCES.get(dataset)(None), tmp, n_shards=2, resume=False)      # module:name imported first
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.exists(os.path.join(path, "index.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
