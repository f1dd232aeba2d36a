"""`python -m hpctrain bench kernels` runs end to end on a tiny size (no timing asserted)."""
import json

import pytest

from hpctrain import kernels
from hpctrain.tools.bench.kernels import main, split_sizes


def test_split_sizes_adds_up_and_varies():
    sizes = split_sizes(1000, 8)
    assert sum(sizes) == 1000 and len(set(sizes)) > 1 and min(sizes) > 0


def test_table_and_json(tmp_path, capsys):
    path = tmp_path / "k.json"
    assert main(["--sizes-mb", "0.25", "--tensors", "3", "--min-time-s", "0", "--device", "cpu",
                 "--json", str(path)]) == 0
    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    ops = {row["op"] for row in report["rows"]}
    assert {"numpy.copyto", "torch copy_", "pack_fp16 x0.5", "unpack_fp16", "sq_norms",
            "lars_update"} <= ops
    for row in report["rows"]:
        assert row["time_ms"] > 0 and row["vs numpy.copyto"] > 0
        assert row["op"] in out
    base = [r for r in report["rows"] if r["op"] == "numpy.copyto"][0]
    assert base["vs numpy.copyto"] == 1.0


def test_cuda_requested_without_gpu_says_why():
    if kernels.backend()[0] == "cuda":
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit, match="--device cuda"):
        main(["--device", "cuda", "--sizes-mb", "0.25"])
