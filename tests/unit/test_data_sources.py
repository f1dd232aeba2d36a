"""Converter round trips for every source on small files made here, and refusal of bad input."""
import gzip
import os
import pickle
import struct

import numpy as np
import pytest
from PIL import Image

from hpctrain.data_tools.cli import main as tools_main
from hpctrain.data_tools.cifar import UnsafePickleError, safe_load
from hpctrain.data_tools.readers import SOURCES
from hpctrain.data_tools.sources import SourceError
from hpctrain.data_tools.writer import convert
from hpctrain.data import ShardSet, read_index
from hpctrain.data.images import decode


def read_all(d, split):
    s = ShardSet(read_index(d), split)
    x, y = s.read_range(0, s.num_samples)
    s.close()
    return x, y


def as_multiset(x, y):
    return sorted((bytes(np.ascontiguousarray(a)), int(b)) for a, b in zip(x, y))


# ---------------------------------------------------------------- ImageFolder
def make_tree(root, classes, per_class, size=(10, 12), ext=".png", seed=0):
    rng = np.random.default_rng(seed)
    truth = []
    for label, cls in enumerate(classes):
        os.makedirs(root / cls, exist_ok=True)
        for k in range(per_class):
            a = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            Image.fromarray(a).save(root / cls / f"{k:03d}{ext}")
            truth.append((a.transpose(2, 0, 1), label))
    return truth


def test_imagefolder_png_round_trip(tmp_path):
    tr = make_tree(tmp_path / "src" / "train", ["cat", "dog", "eel"], 5)
    te = make_tree(tmp_path / "src" / "val", ["cat", "dog", "eel"], 2, seed=1)
    out = str(tmp_path / "out")
    assert tools_main(["convert", "--from", "imagefolder", str(tmp_path / "src"), "--out", out,
                       "--shards", "4", "--no-progress"]) == 0
    idx = read_index(out)
    assert idx.class_names == ["cat", "dog", "eel"] and idx.sample_shape == (3, 10, 12)
    for split, truth in (("train", tr), ("test", te)):
        x, y = read_all(out, split)
        assert as_multiset(x, y) == as_multiset([a for a, _ in truth], [b for _, b in truth])   # PNG is lossless
    _, y = read_all(out, "train")
    assert y.tolist() != sorted(y.tolist())        # shuffled at conversion: classes are mixed


def test_imagefolder_resize_centre_crop(tmp_path):
    os.makedirs(tmp_path / "src" / "a")
    a = np.zeros((20, 40, 3), np.uint8)
    a[:, 10:30] = 200                             # a bright centre band, half the width
    Image.fromarray(a).save(tmp_path / "src" / "a" / "x.png")
    Image.fromarray(a).save(tmp_path / "src" / "a" / "y.png")
    src = SOURCES["imagefolder"](str(tmp_path / "src"), size=(10, 10), test_fraction=0.0)
    px = src.splits["train"].read(0, 2).x
    # cover 10×10: scale 0.5 → 10×20, the centre crop keeps columns 5..15 = the band (edges filtered)
    assert px.shape == (2, 3, 10, 10)
    assert (px[..., 1:9] == 200).all() and (px[..., [0, 9]] > 100).all()


def test_imagefolder_jpeg_keeps_original_bytes(tmp_path):
    make_tree(tmp_path / "src", ["a", "b"], 3, size=(16, 16), ext=".jpg")
    out = str(tmp_path / "out")
    src = SOURCES["imagefolder"](str(tmp_path / "src"), encode="jpeg", test_fraction=0.0, size=(16, 16))
    convert(src, out, 2)
    idx = read_index(out)
    assert idx.encoding == "jpeg" and idx.sample_shape == (3, 16, 16)
    x, y = read_all(out, "train")
    files = {open(p, "rb").read(): label for label, c in enumerate("ab")
             for p in sorted((tmp_path / "src" / c).iterdir())}
    assert sorted((bytes(b), int(lab)) for b, lab in zip(x, y)) == sorted(files.items())
    with Image.open(tmp_path / "src" / "a" / "000.jpg") as img:
        ref = np.asarray(img.convert("RGB")).transpose(2, 0, 1)
    np.testing.assert_array_equal(decode(open(tmp_path / "src" / "a" / "000.jpg", "rb").read(), (3, 16, 16)), ref)


def test_imagefolder_bad_input(tmp_path):
    make_tree(tmp_path / "s1", ["a"], 2)
    os.makedirs(tmp_path / "s1" / "empty")
    with pytest.raises(SourceError, match=r"s1/empty: empty class folder"):
        SOURCES["imagefolder"](str(tmp_path / "s1"))
    make_tree(tmp_path / "s2", ["a"], 2)
    (tmp_path / "s2" / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    src = SOURCES["imagefolder"](str(tmp_path / "s2"), test_fraction=0.0, size=(4, 4))
    with pytest.raises(SourceError, match=r"s2/a/broken.jpg: unreadable image"):
        src.splits["train"].read(0, 3)
    make_tree(tmp_path / "s3", ["a"], 1, size=(8, 8))
    make_tree(tmp_path / "s3", ["b"], 1, size=(9, 8))
    src = SOURCES["imagefolder"](str(tmp_path / "s3"), test_fraction=0.0)
    with pytest.raises(SourceError, match="pass --size"):
        src.splits["train"].read(0, 2)


# ---------------------------------------------------------------- CIFAR
def write_cifar(root, n_per_batch=6, seed=0):
    rng = np.random.default_rng(seed)
    os.makedirs(root)
    xs, ys = {}, {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        y = rng.integers(0, 10, n_per_batch).tolist()
        with open(root / name, "wb") as fh:
            pickle.dump({"batch_label": "b", "data": x, "labels": y, "filenames": ["f"] * n_per_batch}, fh, protocol=2)
        xs[name], ys[name] = x, y
    with open(root / "batches.meta", "wb") as fh:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)], "num_vis": 3072}, fh, protocol=2)
    return xs, ys


def test_cifar_round_trip(tmp_path):
    xs, ys = write_cifar(tmp_path / "cifar-10-batches-py")
    out = str(tmp_path / "out")
    assert tools_main(["convert", "--from", "cifar", str(tmp_path / "cifar-10-batches-py"), "--out", out,
                       "--shards", "3", "--no-progress"]) == 0
    x, y = read_all(out, "train")
    want = np.concatenate([xs[f"data_batch_{i}"] for i in range(1, 6)]).reshape(-1, 3, 32, 32)
    np.testing.assert_array_equal(x, want)                                  # original order kept
    assert y.tolist() == sum((ys[f"data_batch_{i}"] for i in range(1, 6)), [])
    assert read_index(out).class_names[3] == "c3"
    np.testing.assert_array_equal(read_all(out, "test")[0], xs["test_batch"].reshape(-1, 3, 32, 32))


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_cifar_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    root = tmp_path / "cifar-10-batches-py"
    write_cifar(root)
    with open(root / "data_batch_2", "wb") as fh:
        pickle.dump({"data": Evil(marker), "labels": [0]}, fh, protocol=2)
    src = SOURCES["cifar"]                                  # the check: the unpickler refuses os.system
    with pytest.raises(UnsafePickleError, match=r"data_batch_2: refused to unpickle global (posix|os)\.system"):
        src(str(root))
    assert not marker.exists()
    r = tools_main(["convert", "--from", "cifar", str(root), "--out", str(tmp_path / "o"), "--no-progress"])
    assert r == 2 and not marker.exists() and not (tmp_path / "o" / "index.json").exists()
    pickle.loads(pickle.dumps(Evil(marker)))                  # the payload is real: plain pickle runs it
    assert marker.exists()


def test_safe_unpickler_refuses_other_codecs_and_garbage():
    payload = b"\x80\x02c_codecs\nencode\nq\x00X\x01\x00\x00\x00aX\x04\x00\x00\x00zlib\x86R."
    with pytest.raises(UnsafePickleError, match="encoding 'zlib'"):
        safe_load(payload, "f")
    with pytest.raises(SourceError, match="f: not a readable CIFAR pickle"):
        safe_load(b"garbage", "f")


# ---------------------------------------------------------------- MNIST IDX
def idx_bytes(a: np.ndarray) -> bytes:
    return struct.pack(">BBBB", 0, 0, 0x08, a.ndim) + struct.pack(f">{a.ndim}i", *a.shape) + a.tobytes()


def test_mnist_idx_round_trip_gzip_and_raw(tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "fashion-mnist"
    os.makedirs(d)
    data = {}
    for prefix, n in (("train", 13), ("t10k", 5)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, n).astype(np.uint8)
        (d / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(x)))
        (d / f"{prefix}-labels-idx1-ubyte").write_bytes(idx_bytes(y))
        data[prefix] = (x, y)
    out = str(tmp_path / "out")
    assert tools_main(["convert", "--from", "mnist", str(d), "--out", out, "--shards", "2", "--no-progress"]) == 0
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x, y = read_all(out, split)
        np.testing.assert_array_equal(x, data[prefix][0][:, None])
        np.testing.assert_array_equal(y, data[prefix][1])
    assert read_index(out).class_names[9] == "Ankle boot"
    (d / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(data["t10k"][1])[:-2])
    with pytest.raises(SourceError, match=r"t10k-labels-idx1-ubyte: IDX header says \(5,\)"):
        SOURCES["mnist"](str(d))


# ---------------------------------------------------------------- npz
def test_npz_round_trip_and_labels(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 4, 40)
    xt, yt = rng.normal(size=(9, 3)).astype(np.float32), rng.integers(0, 4, 9)
    np.savez(tmp_path / "a.npz", x=x, y=y, x_test=xt, y_test=yt)
    out = str(tmp_path / "out")
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "a.npz"), "--out", out, "--shards", "3",
                       "--no-progress"]) == 0
    np.testing.assert_array_equal(read_all(out, "train")[0], x)
    np.testing.assert_array_equal(read_all(out, "test")[1], yt)
    norm = read_index(out).normalize                     # statistics of the train split, per channel
    np.testing.assert_allclose(norm["mean"], x.mean(0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(norm["std"], x.std(0), rtol=1e-5)
    np.savez(tmp_path / "b.npz", x=x, y=y, x_test=xt, y_test=yt + 3)
    assert tools_main(["convert", "--from", "npz", str(tmp_path / "b.npz"), "--out", str(tmp_path / "o2"),
                       "--class-names", "a,b,c,d", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "b.npz: split test: sample" in err[0] and "outside 0..3" in err[0]


def test_imagefolder_jpeg_stores_whole_images_and_max_side_shrinks_only_larger(tmp_path):
    """``--encode jpeg``: whole images, the index says so; ``--max-side`` re-encodes only the JPEGs
    over it (shrunk to it); a PNG is re-encoded at its own size."""
    import io
    import json

    from hpctrain.data_tools.cli import main as tools_main
    os.makedirs(tmp_path / "src" / "a")
    rng = np.random.default_rng(0)
    for name, (h, w) in {"small.jpg": (30, 40), "big.jpg": (60, 120)}.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "src" / "a" / name)
    Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(tmp_path / "src" / "a" / "p.png")
    out = str(tmp_path / "out")
    assert tools_main(["convert", "--from", "imagefolder", str(tmp_path / "src"), "--out", out, "--encode", "jpeg",
                       "--size", "16", "16", "--test-fraction", "0", "--max-side", "50", "--no-progress"]) == 0
    meta = json.load(open(os.path.join(out, "index.json")))
    assert meta["jpeg"] == {"stored": "whole", "max_side": 50} and read_index(out).stored == "whole"
    x, _ = read_all(out, "train")
    sizes = sorted(Image.open(io.BytesIO(bytes(b))).size for b in x)
    assert sizes == [(20, 24), (40, 30), (50, 25)]                    # (w, h): png whole, small kept, big shrunk
    small = open(tmp_path / "src" / "a" / "small.jpg", "rb").read()
    assert small in [bytes(b) for b in x]
    assert tools_main(["convert", "--from", "digits", "--out", str(tmp_path / "d"), "--max-side", "9"]) == 2
