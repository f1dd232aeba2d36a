"""``inspect`` and ``verify``: a shard directory's summary, a PNG grid of samples, a full check.

Both check every shard's SHA-256 against the index before using its bytes (``inspect
--no-verify`` skips it: a summary of a large dataset then reads only the labels); any problem —
a missing or changed shard, an index field that is absent or points outside the directory — is a
:class:`ShardError`, which ``hpctrain-data`` prints as one line with exit status 2.
"""
from __future__ import annotations

import os

import numpy as np

from hpctrain.data.images import decode_batch
from hpctrain.data.index import ShardError, read_index
from hpctrain.data.shards import ShardSet


def _readable(fn):
    """Run ``fn``; an OSError that escaped the shard checks becomes a one-line ShardError."""
    try:
        return fn()
    except OSError as exc:
        raise ShardError(f"{exc.filename or 'shard directory'}: {exc.strerror or exc}") from None


def verify(directory: str) -> str:
    """Every shard: present, SHA-256 as indexed, shapes/dtypes as indexed, labels in range."""
    idx = read_index(directory)
    for split in idx.splits:
        s = ShardSet(idx, split, driver="serial")
        try:
            _readable(s.verify)
            _readable(s.check)
            _readable(s.check_labels)
        finally:
            s.close()
    return f"{directory}: OK ({', '.join(f'{k} {idx.num_samples(k)}' for k in idx.splits)})"


def summary(directory: str, verify: bool = True) -> str:
    """Classes, normalisation, per split: samples, shards, MiB, class balance (after the checksums)."""
    idx = read_index(directory)
    names = idx.class_names
    shown = ", ".join(names[:10]) + (f", … ({len(names)} in all)" if len(names) > 10 else "")
    lines = [f"{directory}: {idx.encoding} {idx.dtype} samples of shape {tuple(idx.sample_shape)}, "
             f"{idx.num_classes} classes ({shown})"]
    norm = idx.normalize
    if norm:
        lines.append("  normalize: mean " + " ".join(f"{v:.3f}" for v in norm["mean"])
                     + " | std " + " ".join(f"{v:.3f}" for v in norm["std"]))
    for split in idx.splits:
        s = ShardSet(idx, split, driver="serial", verify="shared" if verify else "off")
        try:
            if verify:
                _readable(s.verify)                     # all shards at once, threaded
            counts, n_bytes = np.zeros(idx.num_classes, np.int64), 0
            for i in range(len(s.entries)):
                y = _readable(lambda: s._open(i)["y"][:])  # noqa: B023 (called at once)
                s._check_labels(y, i, 0)
                counts += np.bincount(y, minlength=idx.num_classes)[:idx.num_classes]
                n_bytes += os.path.getsize(s.path(i))
        finally:
            s.close()
        lines.append(f"  {split}: {s.num_samples} samples in {len(s.entries)} shard(s), {n_bytes / 2**20:.1f} MiB; "
                     f"per class min {counts.min() if counts.size else 0} / max {counts.max() if counts.size else 0}")
    return "\n".join(lines)


def grid(directory: str, png: str, split: str = "train", n: int = 64, verify: bool = True) -> str:
    """Write the first ``n`` samples of ``split`` as a labelled PNG grid (matplotlib Agg); the shards
    read are SHA-256-checked first."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    idx = read_index(directory)
    shape = tuple(idx.sample_shape)
    series = len(shape) in (1, 2) and idx.encoding == "raw"     # (L,) or (C, L): a line plot per sample
    if not series and (len(shape) != 3 or shape[0] not in (1, 3)):
        raise ValueError(f"{directory}: samples of shape {shape} are neither images (C, H, W) with C in "
                         f"1, 3 nor series (L,) or (C, L)")
    s = ShardSet(idx, split, driver="serial", verify="shared" if verify else "off")
    try:
        x, y = _readable(lambda: s.read_range(0, min(n, s.num_samples)))
    finally:
        s.close()
    if series:
        return _series_grid(idx, np.asarray(x), y, png, split)
    if idx.encoding == "jpeg":
        x = decode_batch(x, shape)
    cols = int(np.ceil(np.sqrt(len(x)))) or 1
    rows = -(-len(x) // cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(1.2 * cols, 1.35 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, img, label in zip(axes.flat, x, y):
        a = img.astype(np.float64)
        a = (a - a.min()) / max(a.max() - a.min(), 1e-12)    # any dtype/range shown full-scale
        ax.imshow(a[0] if shape[0] == 1 else a.transpose(1, 2, 0), cmap="gray" if shape[0] == 1 else None,
                  interpolation="nearest")
        name = idx.class_names[label] if label < len(idx.class_names) else str(label)
        ax.set_title(name[:12], fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return f"wrote {png}: {len(x)} {split} samples"


def _series_grid(idx, x, y, png: str, split: str) -> str:
    """1-D samples (L,) or (C, L): one small line plot per sample, one line per channel."""
    import matplotlib.pyplot as plt
    x = x.reshape(len(x), -1, x.shape[-1]) if len(x) else x
    cols = min(int(np.ceil(np.sqrt(len(x)))) or 1, 8)
    rows = -(-len(x) // cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(2.0 * cols, 1.4 * rows), squeeze=False, sharex=True)
    for ax in axes.flat:
        ax.axis("off")
    for ax, sample, label in zip(axes.flat, x, y):
        ax.axis("on")
        for ch in sample:
            ax.plot(np.arange(len(ch)), ch.astype(np.float64), linewidth=0.8)
        ax.tick_params(labelsize=5, length=2)
        name = idx.class_names[label] if label < len(idx.class_names) else str(label)
        ax.set_title(name[:12], fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    c = x.shape[1] if len(x) else 0
    return (f"wrote {png}: {len(x)} {split} samples as line plots ({c} channel(s) of length "
            f"{x.shape[-1] if len(x) else 0})")
