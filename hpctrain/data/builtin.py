"""Built-in datasets, converted to shards in a cache directory on first use.

Rank 0 converts (into a temporary directory renamed into place, so concurrent jobs and killed
conversions never leave a half-written dataset) and broadcasts the outcome; nothing else is sent.
"""
from __future__ import annotations

import os
import shutil
import tempfile

from mpi4py import MPI

from hpctrain.errors import UserError

BUILTIN_DATASETS = {"digits": "digits-v1", "signal1d": "signal1d-v1", "tabular": "tabular-v1",
                    "spirals": "spirals-v1"}


def resolve_dataset(dataset: str, cache_dir: str, comm: MPI.Comm) -> str:
    """Return the shard directory for ``dataset`` (a built-in name or a directory). Collective."""
    if dataset not in BUILTIN_DATASETS:
        return dataset
    path = os.path.join(os.path.expanduser(cache_dir), BUILTIN_DATASETS[dataset])
    error = None
    if comm.Get_rank() == 0 and not os.path.exists(os.path.join(path, "index.json")):
        try:
            _convert(dataset, path)
        except Exception as exc:  # reported on every rank by the bcast below
            error = f"converting built-in dataset {dataset!r} into {path}: {exc}"
    error = comm.bcast(error, root=0)
    if error:
        raise UserError(error)           # the same line on every rank (rank 0's traceback is not kept)
    return path


def _convert(dataset: str, path: str) -> None:
    from hpctrain.data_tools.readers import SOURCES
    from hpctrain.data_tools.writer import convert

    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        convert(SOURCES[dataset](None), tmp, n_shards=2, resume=False)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.exists(os.path.join(path, "index.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
