"""What a rank's loader will hold in memory, checked against the machine before it is allocated.

The shuffle window (``shuffle_window`` samples, at least one batch, held twice: the window and
what carries over) and the prefetched batches (``prefetch`` + 1, as float32) are sized from the
loader's arguments and the index's sample shape. A window too large for the node would be a
``MemoryError`` traceback, or the kernel's OOM killer, minutes in; here it is one line naming
the argument (:class:`LoaderTooLarge`; the job names its config key), at start-up, before any of
it is allocated. The limit is half of the memory the
kernel says is available (``MemAvailable``) shared by the ranks of the node: the other half is
the model's, the HDF5 caches' and the page cache's.

JPEG shards hold encoded bytes in the window: a sample is sized as the split's shard files' bytes
over its samples (the index's ``blocks.file_bytes``, else the file's size), and the decode pool's
batches in flight (``prefetch`` + 2 + its lookahead, decoded ``sample_shape``) are counted too.
"""
from __future__ import annotations

import math
import os

import numpy as np

from hpctrain.errors import UserError

SHARE = 0.5            # of the memory available to the node's ranks
BLOB_OVERHEAD = 48     # a window slot's bytes object and its pointer, beyond the encoded bytes
DEFAULT_PREFETCH = 2   # the loader's default prefetch: a refusal it would avoid blames prefetch


class LoaderTooLarge(UserError, ValueError):
    """The loader would not fit in memory; ``argument`` names the loader argument to lower (the
    job maps it to its config key), ``detail`` says how much it would take."""

    def __init__(self, argument: str, detail: str):
        super().__init__(f"train_loader {argument}: {detail}")
        self.argument, self.detail = argument, detail


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo``, else physical memory (sysconf), else None."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def loader_parts(sample_shape, dtype: str, *, batch_size: int, shuffle_window: int, prefetch: int,
                 stored_bytes: float | None = None) -> dict[str, int]:
    """Bytes a training loader holds, by the argument that sizes each part: the window buffers
    (``shuffle_window``, at least ``batch_size``), the prefetched float32 batches (``prefetch``)
    and, for JPEG (``stored_bytes`` encoded bytes per sample, held in the window), the decode
    pool's in-flight batches of decoded ``sample_shape`` (``prefetch`` too)."""
    n = math.prod(int(d) for d in sample_shape)
    window = max(shuffle_window, batch_size)
    prefetched = (prefetch + 1) * batch_size * (n * 4 + 8)
    if stored_bytes is None:
        return {"shuffle_window": 2 * window * (n * np.dtype(dtype).itemsize + 8), "prefetch": prefetched}
    from hpctrain.data.jpegstream import LOOKAHEAD
    in_flight = (prefetch + 2 + LOOKAHEAD) * batch_size * n * np.dtype(dtype).itemsize
    return {"shuffle_window": 2 * window * (math.ceil(stored_bytes) + BLOB_OVERHEAD + 8),
            "prefetch": prefetched + in_flight}


def loader_bytes(sample_shape, dtype: str, *, batch_size: int, shuffle_window: int, prefetch: int,
                 stored_bytes: float | None = None) -> int:
    """Bytes a training loader holds (:func:`loader_parts`, summed)."""
    return sum(loader_parts(sample_shape, dtype, batch_size=batch_size, shuffle_window=shuffle_window,
                            prefetch=prefetch, stored_bytes=stored_bytes).values())


def jpeg_bytes_per_sample(index, split: str = "train") -> float | None:
    """Encoded bytes per sample of ``split``'s shard files (None: not known, e.g. a file missing)."""
    try:
        sp = index.splits[split]
        total = 0
        for e in sp["shards"]:
            fb = (e.get("blocks") or {}).get("file_bytes")
            total += int(fb) if fb is not None else os.path.getsize(os.path.join(index.directory, e["file"]))
        return total / max(int(sp["num_samples"]), 1)
    except (KeyError, TypeError, ValueError, OSError):
        return None


def check_loader_memory(index, *, batch_size: int, shuffle_window: int, prefetch: int, local_size: int = 1,
                        available: int | None = None, split: str = "train") -> None:
    """Raise :class:`LoaderTooLarge` if the loader would take more than its share of the node's
    available memory, naming the argument to blame: ``prefetch`` when its default would fit,
    else ``shuffle_window`` (or ``batch_size`` when the batch is larger than the window)."""
    avail = available_bytes() if available is None else available
    if not avail:
        return
    stored = jpeg_bytes_per_sample(index, split) if getattr(index, "encoding", "raw") == "jpeg" else None
    parts = loader_parts(index.sample_shape, index.dtype, batch_size=batch_size, shuffle_window=shuffle_window,
                         prefetch=prefetch, stored_bytes=stored)
    need = sum(parts.values())
    share = int(avail * SHARE / max(local_size, 1))
    if need > share:
        what = (f"{index.dtype} {tuple(index.sample_shape)}" if stored is None else
                f"JPEG (~{stored / 1024:,.0f} KiB each, decoded to {tuple(index.sample_shape)})")
        lean = loader_parts(index.sample_shape, index.dtype, batch_size=batch_size, shuffle_window=shuffle_window,
                            prefetch=min(prefetch, DEFAULT_PREFETCH), stored_bytes=stored)
        if prefetch > DEFAULT_PREFETCH and sum(lean.values()) <= share:   # the default would fit: prefetch's fault
            argument, part = "prefetch", parts["prefetch"]
            held = f"{prefetch + 1:,} prefetched batches of {batch_size:,} samples of {what}"
        else:
            argument = "shuffle_window" if shuffle_window >= batch_size else "batch_size"
            part = parts["shuffle_window"]
            held = f"a window of {max(shuffle_window, batch_size):,} samples of {what}"
        raise LoaderTooLarge(argument, f"{held} takes {part / 2**30:,.2f} GiB per rank (the loader "
                             f"{need / 2**30:,.2f} GiB), over {SHARE:.0%} of the memory available to each of "
                             f"the node's {local_size} rank(s) ({share / 2**30:,.2f} GiB); choose a smaller value")
