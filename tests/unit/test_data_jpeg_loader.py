"""Whole-image JPEG shards through the loader: crops cut at decode on a pool of workers.

Batches must not depend on the number of decode workers, a resumed epoch replays the same crops,
a file that does not decode is one error naming its shard and sample, and a worker that fails
ends the iteration with one line instead of hanging (threads cannot be killed: the equivalent of
a killed worker here is a worker raising an unexpected exception).
"""
import numpy as np
import pytest
import torch

from hpctrain.tools.bench.input_data import photos
from hpctrain.data import ShardLoader, ShardSet, read_index
from hpctrain.data import decoders
from hpctrain.data.augment import Augment
from hpctrain.data.decodepool import DecodeWorkerError, default_workers, resolve_workers
from hpctrain.data.index import ShardError
from hpctrain.data.evalbatches import eval_batches
from hpctrain.data_tools.sources import Chunk, Source, SplitSource
from hpctrain.data_tools.writer import convert

N, SHAPE, BAD = 40, (3, 32, 32), 13


def write_jpeg_shards(d, blobs, n_shards=2):
    def read(lo, hi):
        return Chunk(list(blobs[lo:hi]), np.arange(lo, hi) % 4, np.zeros((hi - lo, 3, 1, 1), np.uint8))
    src = Source({"train": SplitSource(len(blobs), read)}, list("abcd"), SHAPE, "uint8", "jpeg", "test",
                 extra={"jpeg": {"stored": "whole", "max_side": None}})
    convert(src, str(d), n_shards, resume=False)
    return str(d)


@pytest.fixture(scope="module")
def blobs():
    return photos(N, seed=1, size=(60, 72))


@pytest.fixture(scope="module")
def shards(tmp_path_factory, blobs):
    return write_jpeg_shards(tmp_path_factory.mktemp("jpeg"), blobs)


def loader(d, workers, **kw):
    s = ShardSet(read_index(d), "train")
    opts = dict(rank=1, size=2, batch_size=5, block_size=4, shuffle_window=8, seed=3,
                transform=Augment("rrc"), workers=workers)
    return ShardLoader(s, **{**opts, **kw})


def batches(ld, epoch, **kw):
    out = [(x.clone(), y.clone()) for x, y in ld.epoch(epoch, **kw)]
    return out


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def test_index_says_whole_images(shards):
    assert read_index(shards).stored == "whole"


def test_batches_identical_for_1_2_4_workers(shards):
    runs = {}
    for w in (1, 2, 4):
        ld = loader(shards, w)
        runs[w] = [batches(ld, e) for e in (0, 1)] + [batches(ld, 1, augment=False)]
        assert ld.jpeg.workers == w and "random-resized crops cut at decode" in ld.describe()
        ld.close()
    assert same(runs[1][0], runs[2][0]) and same(runs[1][0], runs[4][0])
    assert same(runs[1][1], runs[4][1]) and same(runs[1][2], runs[2][2])
    assert not same(runs[1][0], runs[1][1])          # crops change with the epoch
    assert not same(runs[1][1], runs[1][2])          # and are not the evaluation crop
    assert runs[1][0][0][0].shape == (5, *SHAPE)


def test_resumed_epoch_replays_the_same_crops(shards):
    full = batches(loader(shards, 2), 2)
    resumed = batches(loader(shards, 1, prefetch=0), 2, skip=3)
    assert same(full[3:], resumed)


def test_eval_crop_is_deterministic_and_unaugmented(shards):
    a = [x for x, _ in eval_batches(ShardSet(read_index(shards), "train"), rank=0, size=1, batch_size=7, workers=2)]
    b = [x for x, _ in eval_batches(ShardSet(read_index(shards), "train"), rank=0, size=1, batch_size=7)]
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and sum(len(u) for u in a) == N


def test_corrupt_jpeg_in_the_middle_names_shard_and_sample(tmp_path, blobs):
    bad = list(blobs)
    bad[BAD] = bad[BAD][:200] + b"\x00" * 50          # a header, then garbage: not a JPEG any more
    d = write_jpeg_shards(tmp_path, bad)
    idx = read_index(d)
    first = idx.splits["train"]["shards"][0]["num_samples"]
    shard, local = (0, BAD) if BAD < first else (1, BAD - first)
    name = idx.splits["train"]["shards"][shard]["file"]
    for rank in (0, 1):                                # whichever rank's plan holds it
        ld = loader(d, 2, rank=rank, size=2)
        try:
            for _ in ld.epoch(0):
                pass
        except ShardError as exc:
            msg = str(exc)
            assert "\n" not in msg and name in msg and f"sample {local} (global {BAD})" in msg
            assert "JPEG does not decode" in msg
            break
        finally:
            ld.close()
    else:
        pytest.fail("no rank hit the corrupt sample")
    with pytest.raises(ShardError, match=f"sample {local} \\(global {BAD}\\)"):
        for _ in eval_batches(ShardSet(idx, "train"), rank=0, size=1, batch_size=8, workers=2):
            pass


@pytest.mark.timeout(30)
def test_a_worker_that_fails_ends_the_epoch_with_one_line(shards, monkeypatch):
    import itertools
    real, calls = decoders.decode_crop, itertools.count()

    def flaky(blob, crop, *a):
        if next(calls) == 7:                           # the 8th image decoded, whichever worker takes it
            raise RuntimeError("worker lost")
        return real(blob, crop, *a)
    monkeypatch.setattr(decoders, "decode_crop", flaky)
    ld = loader(shards, 4, prefetch=2)
    with pytest.raises(DecodeWorkerError) as info:
        for _ in ld.epoch(0):
            pass
    ld.close()
    msg = str(info.value)
    assert "\n" not in msg and "hpctrain-decode" in msg and "RuntimeError: worker lost" in msg
    assert not info.value.agreed                       # one rank's error: it aborts the job (errors.py)


def test_default_workers_from_affinity():
    node = set(range(32))
    assert default_workers(node, [node] * 4) == 8                               # unbound / one cpuset: shared
    assert default_workers(node, [node] * 4, node_reader=True) == 32           # the node reader decodes for all
    socket0, socket1 = set(range(16)), set(range(16, 32))
    assert default_workers(socket0, [socket0, socket0, socket1, socket1]) == 8  # bound by socket: 2 per socket
    own = [set(range(6 * r, 6 * r + 6)) for r in range(4)]
    assert default_workers(own[1], own) == 6                                    # disjoint: its own cores
    # overlapping: rank 1 shares cores with ranks 0 and 2, not with rank 3
    lap = [set(range(0, 8)), set(range(6, 14)), set(range(12, 20)), set(range(24, 32))]
    assert default_workers(lap[1], lap) == 8 // 3
    assert default_workers(lap[3], lap) == 8
    assert default_workers({0, 1}, [{0, 1}] * 8) == 1                           # never none
    assert default_workers(set(range(200)), [set(range(200))]) == 64            # at most MAX_WORKERS
    assert resolve_workers(3) == 3 and resolve_workers(0) >= 1
    with pytest.raises(ValueError, match="data.workers -1"):
        resolve_workers(-1)


def test_workers_normalise_bit_for_bit_as_the_batch_normalisation(shards):
    from hpctrain.data.augment import Normalize
    ld = loader(shards, 2)
    got = batches(ld, 0)
    ld.close()                                      # its thread runs on into epoch 1 in the same buffers
    decoded = list(loader(shards, 2).decoded_batches(0))     # uint8, as a raw (GPU) job gets them
    norm = Normalize.of(ld.shards.index)
    assert decoded[0][0].dtype == np.uint8 and len(got) == len(decoded)
    assert all(torch.equal(x, norm(u)) for (x, _), (u, _) in zip(got, decoded))


def test_fitted_shards_decode_as_before_on_the_pool(tmp_path):
    """Shards written before whole images (index without ``jpeg``): the old decode, now on the pool."""
    from hpctrain.data.images import decode_batch
    from hpctrain.data.evalbatches import eval_prep
    from hpctrain.data_tools.sources import from_arrays
    x = np.random.default_rng(0).integers(0, 256, (10, 3, 16, 16), dtype=np.uint8)
    convert(from_arrays({"train": (x, np.arange(10) % 2)}, ["a", "b"], "t", encode="jpeg"), str(tmp_path), 2)
    s = ShardSet(read_index(str(tmp_path)), "train")
    assert s.index.stored == "fitted"
    got = torch.cat([b for b, _ in eval_batches(s, rank=0, size=1, batch_size=4, workers=2)])
    blobs, _ = s.read_range(0, 10)
    assert torch.equal(got, eval_prep(s)(decode_batch(blobs, (3, 16, 16))))


@pytest.mark.parametrize("exc", ["bomb", "memory"])
def test_a_decompression_bomb_or_a_huge_image_is_bad_data_not_a_bug(shards, blobs, monkeypatch, exc):
    from PIL.Image import DecompressionBombError
    raised = DecompressionBombError("too many pixels") if exc == "bomb" else MemoryError()
    real = decoders.decode_crop

    def bomb(blob, crop, *a):
        if bytes(decoders._bytes(blob)) == blobs[BAD]:
            raise raised
        return real(blob, crop, *a)
    monkeypatch.setattr(decoders, "decode_crop", bomb)
    name = type(raised).__name__
    with pytest.raises(ShardError, match=rf"sample \d+ \(global {BAD}\): JPEG does not decode \({name}"):
        for _ in eval_batches(ShardSet(read_index(shards), "train"), rank=0, size=1, batch_size=8, workers=2):
            pass


def test_evaluation_reuses_a_given_pool_and_leaves_it_open(shards, monkeypatch):
    from hpctrain.data import decodepool
    made = []
    real_init = decodepool.DecodePool.__init__
    monkeypatch.setattr(decodepool.DecodePool, "__init__", lambda self, w: (made.append(self), real_init(self, w))[1])
    s = ShardSet(read_index(shards), "train")
    want = [x for x, _ in eval_batches(s, rank=0, size=1, batch_size=8, workers=2)]
    assert len(made) == 1 and made[0]._ex is None                     # its own pool, closed at the end
    pool = decodepool.DecodePool(2)
    got = [x for x, _ in eval_batches(s, rank=0, size=1, batch_size=8, pool=pool)]
    assert len(made) == 2 and pool._ex is not None                    # no pool made; the caller's left open
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    pool.close()
    s.close()
