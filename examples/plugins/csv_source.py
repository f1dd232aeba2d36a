"""A data source in one file: a CSV table of numbers, one sample a row, the class label in the
last column (``python -m hpctrain.data_tools convert --from examples.plugins.csv_source:csv FILE.csv``).

A first row whose first field is not a number is a header and skipped. Samples are stored as
float32 ``(N, columns - 1)``, like the built-in ``tabular`` dataset; the test split is a seeded
``--test-fraction`` of the rows. The checks are the shared ones of :mod:`hpctrain.data_tools.sources`
(labels, finite values), so a bad file is one :class:`SourceError` naming it.
"""
from __future__ import annotations

import os

import numpy as np
from hpctrain.data_tools.sources import SourceError, check_samples, count_classes, from_arrays, source, train_test_split


def _has_header(path: str) -> bool:
    with open(path, encoding="utf-8") as fh:
        first = fh.readline().split(",")[0].strip()
    try:
        float(first)
    except ValueError:
        return True
    return False


@source("csv")
def load_csv(src: str | None, *, test_fraction: float = 0.2, seed: int = 0, class_names=None,
             allow_nonfinite: bool = False, **_):
    if not src or not os.path.isfile(src):
        raise SourceError(f"{src}: csv file not found (or not a regular file)")
    try:
        table = np.loadtxt(src, delimiter=",", dtype=np.float64, ndmin=2, skiprows=int(_has_header(src)))
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceError(f"{src}: not a CSV of numbers ({exc})") from None
    if table.shape[1] < 2 or not len(table):
        raise SourceError(f"{src}: need rows of at least one feature and a label, got shape {table.shape}")
    labels = table[:, -1]
    if not np.array_equal(labels, np.round(labels)):
        raise SourceError(f"{src}: the last column holds the labels and must be whole numbers")
    x, y = table[:, :-1].astype(np.float32), labels.astype(np.int64)
    check_samples(x, f"{src}: rows", allow_nonfinite)
    n_classes = count_classes({"last column": y}, src)
    splits = train_test_split(x, y, test_fraction, seed, src)
    names = class_names or [str(c) for c in range(n_classes)]
    return from_arrays(splits, names, src, allow_nonfinite=True)
