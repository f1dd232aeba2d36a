"""``inspect`` and ``verify``: a shard directory's summary, a PNG grid of samples, a full check."""
from __future__ import annotations

import os

import numpy as np

from hpctrain.data.images import decode_batch
from hpctrain.data.shards import ShardSet, read_index


def verify(directory: str) -> str:
    """Every shard: present, SHA-256 as indexed, shapes/dtypes as indexed, labels in range."""
    idx = read_index(directory)
    for split in idx.splits:
        s = ShardSet(idx, split, driver="serial")
        try:
            s.verify()
            s.check()
            s.check_labels()
        finally:
            s.close()
    return f"{directory}: OK ({', '.join(f'{k} {idx.num_samples(k)}' for k in idx.splits)})"


def summary(directory: str) -> str:
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
        s = ShardSet(idx, split, driver="serial")
        try:
            n_bytes = sum(os.path.getsize(s.path(i)) for i in range(len(s.entries)))
            counts = np.zeros(idx.num_classes, np.int64)
            for i in range(len(s.entries)):
                counts += np.bincount(s._open(i)["y"][:], minlength=idx.num_classes)[:idx.num_classes]
        finally:
            s.close()
        lines.append(f"  {split}: {s.num_samples} samples in {len(s.entries)} shard(s), {n_bytes / 2**20:.1f} MiB; "
                     f"per class min {counts.min() if counts.size else 0} / max {counts.max() if counts.size else 0}")
    return "\n".join(lines)


def grid(directory: str, png: str, split: str = "train", n: int = 64) -> str:
    """Write the first ``n`` samples of ``split`` as a labelled PNG grid (matplotlib Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    idx = read_index(directory)
    shape = tuple(idx.sample_shape)
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise ValueError(f"{directory}: samples of shape {shape} are not images (C, H, W)")
    s = ShardSet(idx, split, driver="serial")
    try:
        x, y = s.read_range(0, min(n, s.num_samples))
    finally:
        s.close()
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
