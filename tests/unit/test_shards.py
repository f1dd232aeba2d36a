"""Shard format: round trips, the loader's coverage, and one-line errors naming the file."""
import json
import os

import numpy as np
import pytest

from hpctrain.data_tools.sources import SOURCES
from hpctrain.data_tools.writer import write_dataset
from hpctrain.data import ShardError, ShardLoader, ShardSet, read_index
from tests.integration.inprocess import run_data_tools


@pytest.fixture
def npz_dataset(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(103, 3, 5, 4), dtype=np.uint8)
    y = rng.integers(0, 7, size=103)
    write_dataset(str(tmp_path / "ds"), {"train": (x, y), "test": (x[:10], y[:10])},
                  [str(i) for i in range(7)], n_shards=4)
    return str(tmp_path / "ds"), x, y


def test_round_trip_across_shards(npz_dataset):
    d, x, y = npz_dataset
    s = ShardSet(read_index(d), "train")
    assert len(s.entries) == 4 and s.num_samples == 103
    gx, gy = s.read_range(0, 103)
    np.testing.assert_array_equal(gx, x)
    np.testing.assert_array_equal(gy, y)
    gx, gy = s.read_range(20, 80)     # spans several shards
    np.testing.assert_array_equal(gx, x[20:80])
    s.verify()


def test_digits_convert_cli(tmp_path, capsys):
    out = tmp_path / "digits"
    r = run_data_tools(capsys, "convert", "--from", "digits", "--out", str(out), "--shards", "3")
    assert r.returncode == 0, r.stderr
    idx = read_index(str(out))
    assert idx.num_samples("train") + idx.num_samples("test") == 1797
    assert idx.sample_shape == (1, 8, 8) and idx.num_classes == 10
    src = SOURCES["digits"](None)
    want = src.splits["test"].read(0, src.splits["test"].num_samples)
    got, _ = ShardSet(idx, "test").read_range(0, idx.num_samples("test"))
    np.testing.assert_array_equal(got, want.x)
    r = run_data_tools(capsys, "verify", str(out))
    assert r.returncode == 0 and "OK" in r.stdout


def test_npz_source(tmp_path):
    p = tmp_path / "a.npz"
    np.savez(p, x=np.zeros((10, 2), np.float32), y=np.arange(10) % 3)
    src = SOURCES["npz"](str(p), test_fraction=0.2, seed=0)
    assert src.splits["train"].num_samples == 8 and src.class_names == ["0", "1", "2"]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_loader_sees_each_sample_once(npz_dataset, size):
    d, x, y = npz_dataset
    s = ShardSet(read_index(d), "train")
    seen = []
    for rank in range(size):
        loader = ShardLoader(s, rank=rank, size=size, batch_size=5, block_size=8, shuffle_window=16, prefetch=2)
        batches = list(loader.epoch(0))
        assert len(batches) == loader.steps == 103 // (5 * size)
        seen += [int(v) for b in batches for v in b[1]]
    assert len(seen) == loader.steps * 5 * size


def test_truncated_shard_names_file(npz_dataset):
    d, _, _ = npz_dataset
    path = os.path.join(d, "train-00001-of-00004.h5")
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2)
    s = ShardSet(read_index(d), "train")
    with pytest.raises(ShardError, match="train-00001-of-00004.h5"):
        s.check()
        s.read_range(0, 103)
    with pytest.raises(ShardError, match="checksum mismatch"):
        s.verify()


def test_missing_shard_and_index(npz_dataset, tmp_path):
    d, _, _ = npz_dataset
    os.remove(os.path.join(d, "train-00002-of-00004.h5"))
    with pytest.raises(ShardError, match="train-00002-of-00004.h5: shard file missing"):
        ShardSet(read_index(d), "train").check()
    with pytest.raises(ShardError, match="not found"):
        read_index(str(tmp_path / "nope"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ShardError, match="index.json: missing"):
        read_index(str(tmp_path / "empty"))


def test_index_count_mismatch(npz_dataset):
    d, _, _ = npz_dataset
    meta = json.load(open(os.path.join(d, "index.json")))
    meta["splits"]["train"]["num_samples"] = 999
    json.dump(meta, open(os.path.join(d, "index.json"), "w"))
    with pytest.raises(ShardError, match="says 999 samples"):
        read_index(d)


def _rehash(d):
    """Record the files' current digests (SHA-256 and blocks) in the index: the structural checks
    behind the checksum run."""
    from hpctrain.data.shardwriter import shard_digests
    meta = json.load(open(os.path.join(d, "index.json")))
    for sp in meta["splits"].values():
        for e in sp["shards"]:
            e.update(shard_digests(os.path.join(d, e["file"]), e["blocks"]["bytes"]))
    json.dump(meta, open(os.path.join(d, "index.json"), "w"))


def _rewrite(path, key, data):
    import h5py
    with h5py.File(path, "r+") as fh:
        del fh[key]
        fh.create_dataset(key, data=data)
    _rehash(os.path.dirname(path))


def test_wrong_dtype_shape_and_missing_dataset(npz_dataset):
    d, x, y = npz_dataset
    p1, p2, p3 = (os.path.join(d, f"train-0000{i}-of-00004.h5") for i in (1, 2, 3))
    _rewrite(p1, "x", x[26:52].astype(np.float32))
    _rewrite(p2, "x", x[52:77, :, :4])
    import h5py
    with h5py.File(p3, "r+") as fh:
        del fh["y"]
    _rehash(d)
    s = ShardSet(read_index(d), "train")
    with pytest.raises(ShardError, match=r"train-00001-of-00004.h5: dataset 'x' has dtype float32, index says uint8"):
        s._open(1)
    with pytest.raises(ShardError, match=r"train-00002-of-00004.h5: dataset 'x' has shape \(25, 3, 4, 4\)"):
        s._open(2)
    with pytest.raises(ShardError, match=r"train-00003-of-00004.h5: missing dataset 'y'"):
        s._open(3)


def test_label_out_of_range_names_file_and_sample(npz_dataset):
    d, x, y = npz_dataset
    bad = y[26:52].copy()
    bad[5] = 7                                   # 7 classes: labels 0..6
    _rewrite(os.path.join(d, "train-00001-of-00004.h5"), "y", bad)
    s = ShardSet(read_index(d), "train")
    s.read_range(0, 26)                          # shard 0 is fine
    with pytest.raises(ShardError, match=r"train-00001-of-00004.h5: sample 5 \(global 31\) has label 7, outside 0..6"):
        s.read_range(20, 40)
    with pytest.raises(ShardError, match="sample 5"):
        s.check_labels()


def test_version1_index_still_reads(npz_dataset):
    d, x, _ = npz_dataset
    meta = json.load(open(os.path.join(d, "index.json")))
    meta["version"] = 1
    del meta["encoding"]
    json.dump(meta, open(os.path.join(d, "index.json"), "w"))
    idx = read_index(d)
    assert idx.encoding == "raw"
    np.testing.assert_array_equal(ShardSet(idx, "train").read_range(0, 5)[0], x[:5])
    meta["version"] = 6
    json.dump(meta, open(os.path.join(d, "index.json"), "w"))
    with pytest.raises(ShardError, match="field 'version' is 6"):
        read_index(d)


def test_serial_driver_described(npz_dataset):
    d, _, _ = npz_dataset
    s = ShardSet(read_index(d), "train")
    assert s.driver == "serial" and "serial per-shard files" in s.describe() and "no communicator" in s.describe()


def test_direct_reads_and_h5py_fallback_agree(npz_dataset):
    import h5py
    d, x, y = npz_dataset
    path = os.path.join(d, "train-00001-of-00004.h5")
    with h5py.File(path, "r+") as fh:                    # shard 1 rewritten chunked: no direct reads
        data = fh["x"][:]
        del fh["x"]
        fh.create_dataset("x", data=data, chunks=(4, 3, 5, 4))
    _rehash(d)
    s = ShardSet(read_index(d), "train")
    gx, gy = s.read_range(10, 90)
    np.testing.assert_array_equal(gx, x[10:90])
    np.testing.assert_array_equal(gy, y[10:90])
    assert s._direct[0][0] is not None and s._direct[1][0] is None and s._direct[1][1] is not None


def test_cut_tail_is_reported_as_truncated(npz_dataset):
    d, _, _ = npz_dataset
    path = os.path.join(d, "train-00003-of-00004.h5")
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 100)
    _rehash(d)
    with pytest.raises(ShardError, match="train-00003-of-00004.h5: (truncated|cannot open shard)"):
        ShardSet(read_index(d), "train").check()
