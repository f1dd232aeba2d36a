"""Every descriptive field of index.json is checked at open with convert's limits (issue 37, item 5):
one ShardError line naming the file and the field, before anything is sized from it."""
import json

import pytest

from hpctrain.data.index import ShardError, read_index
from hpctrain.data.indexfields import MAX_CLASSES, MAX_SAMPLE_BYTES

GOOD = {"format": "hpctrain-shards", "version": 3, "sample_shape": [3, 4, 4], "dtype": "uint8", "num_classes": 10,
        "class_names": [str(i) for i in range(10)], "normalize": {"mean": [1.0, 2.0, 3.0], "std": [1.0, 0.5, 2.0]},
        "splits": {}}


def write(tmp_path, **changes):
    meta = {**GOOD, **changes}
    meta = {k: v for k, v in meta.items() if v is not ...}
    (tmp_path / "index.json").write_text(json.dumps(meta))
    return str(tmp_path)


def test_a_good_index_opens(tmp_path):
    idx = read_index(write(tmp_path))
    assert idx.num_classes == 10 and idx.sample_shape == (3, 4, 4)
    assert read_index(write(tmp_path, normalize=..., class_names=...)).normalize == {}
    assert read_index(write(tmp_path, encoding="jpeg")).encoding == "jpeg"
    assert read_index(write(tmp_path, encoding="jpeg", sample_shape=[1, 4, 4], normalize=...)).sample_shape == (1, 4, 4)
    assert read_index(write(tmp_path, dtype="float32")).dtype == "float32"      # raw: any real type


@pytest.mark.parametrize("changes, field", [
    ({"num_classes": "ten"}, "num_classes"),
    ({"num_classes": 10**12, "class_names": []}, "num_classes"),
    ({"num_classes": -3, "class_names": []}, "num_classes"),
    ({"num_classes": 10.7}, "num_classes"),
    ({"num_classes": True, "class_names": []}, "num_classes"),
    ({"num_classes": MAX_CLASSES + 1, "class_names": []}, "num_classes"),
    ({"class_names": ["a"]}, "class_names"),
    ({"dtype": "bool"}, "dtype"),
    ({"dtype": "complex64"}, "dtype"),
    ({"dtype": "object"}, "dtype"),
    ({"dtype": "nonsense"}, "dtype"),
    ({"dtype": 7}, "dtype"),
    ({"sample_shape": [3, 0, 4]}, "sample_shape"),
    ({"sample_shape": "3x4"}, "sample_shape"),
    ({"sample_shape": [3, 4.0, 4]}, "sample_shape"),
    ({"sample_shape": [3, 100000, 100000]}, "sample_shape"),
    ({"normalize": {"mean": ["a", "b", "c"], "std": [1, 1, 1]}}, "normalize.mean"),
    ({"normalize": {"mean": [0.0], "std": [1, 1, 1]}}, "normalize.mean"),
    ({"normalize": {"mean": [0.0, float("nan"), 0.0], "std": [1, 1, 1]}}, "normalize.mean"),
    ({"normalize": {"mean": [0, 0, 0], "std": [1, 0, 1]}}, "normalize.std"),
    ({"normalize": {"mean": [0, 0, 0], "std": [1, -2, 1]}}, "normalize.std"),
    ({"normalize": [1, 2]}, "normalize"),
    ({"encoding": "jpeg", "dtype": "float32"}, "dtype"),
    ({"encoding": "jpeg", "sample_shape": [4, 4, 4], "normalize": ...}, "sample_shape"),
    ({"encoding": "jpeg", "sample_shape": [4, 4], "normalize": ...}, "sample_shape"),
    ({"encoding": "jpeg", "sample_shape": [2, 4, 4], "normalize": ...}, "sample_shape"),
])
def test_a_wrong_field_is_one_line_naming_it(tmp_path, changes, field):
    with pytest.raises(ShardError, match=rf"index\.json: field '{field}' ") as err:
        read_index(write(tmp_path, **changes))
    assert "\n" not in str(err.value)


def test_the_sample_limit_is_converts():
    from hpctrain.data_tools import sources
    assert sources.MAX_SAMPLE_BYTES == MAX_SAMPLE_BYTES and sources.MAX_CLASSES == MAX_CLASSES
