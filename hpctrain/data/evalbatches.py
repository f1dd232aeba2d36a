"""Evaluation batches from a :class:`ShardSet`: each rank reads its balanced contiguous share in
order, the partial last batch kept, never augmented; JPEG shards take the centre crop (whole-image
shards) or the fitted decode. Apart from the training loader: no plan, no window, no prefetch.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from hpctrain.data import plan
from hpctrain.data.augment import BatchPrep, Normalize
from hpctrain.data.index import ShardError
from hpctrain.data.loader import host_tensor
from hpctrain.data.shards import ShardSet


def eval_batches(shards: ShardSet, *, rank: int, size: int, batch_size: int,
                 raw: bool = False, workers: int = 1, pool=None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's contiguous share of an evaluation split, in order; last batch may be short.

    JPEG shards decode on ``pool`` (a :class:`~hpctrain.data.decodepool.DecodePool` the caller
    owns and keeps open, e.g. the training loader's), else on a pool of ``workers`` made here.

    With ``raw`` the samples come as stored, pinned when CUDA is available, for
    :func:`eval_prep` on the device they are copied to."""
    idx = shards.index
    pin = raw and torch.cuda.is_available()
    prep = eval_prep(shards)
    lo, hi = plan.block_range(shards.num_samples, size, rank)
    decode, own = eval_decoder(shards, workers, pool) if idx.encoding == "jpeg" else (None, None)
    try:
        for s in range(lo, hi, batch_size):
            x, y = shards.read_range(s, min(hi, s + batch_size))
            if decode is not None:
                x = decode(x, s)
            yield (host_tensor(x, pin), host_tensor(y, pin)) if raw else (prep(x), torch.from_numpy(y))
    finally:
        if own is not None:
            own.close()


def eval_prep(shards: ShardSet) -> BatchPrep:
    """Evaluation's :class:`BatchPrep` for ``shards``: normalisation only, never augmented."""
    return BatchPrep(Normalize.of(shards.index))


def eval_decoder(shards: ShardSet, workers: int = 1, pool=None):
    """``(decode, own)``: ``decode(blobs, first_global_id)`` for evaluation: the centre crop (whole-image shards) or
    the fitted decode, on ``pool`` (else on a new pool of ``workers`` threads, returned as ``own`` for the caller
    to close; None when ``pool`` was given); a bad file is a ShardError naming its sample."""
    from hpctrain.data.decodepool import CropDecoder, DecodePool, SampleError
    from hpctrain.data.jpegstream import FittedDecoder, sample_name
    idx, own = shards.index, None if pool is not None else DecodePool(workers)
    pool = pool if pool is not None else own
    cls = CropDecoder if idx.stored == "whole" else FittedDecoder
    decoder = cls(tuple(idx.sample_shape), pool, "auto" if idx.stored == "whole" else "pil")

    def decode(blobs, first: int) -> np.ndarray:
        try:
            return decoder.decode(blobs, False)
        except SampleError as exc:
            raise ShardError(f"{sample_name(shards, first + exc.k)}: JPEG does not decode ({exc})") from None
    return decode, own
