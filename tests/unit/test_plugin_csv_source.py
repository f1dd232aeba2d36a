"""The worked example of a data-source plugin (examples/plugins/csv_source.py,
docs/development.md): ``--from module:name`` converts a CSV whose rows, parsed by Python's own
``csv`` module, are exactly the samples and labels in the shards; a bad file is one line."""
import csv

import numpy as np
import pytest

from hpctrain.data_tools.cli import main as tools_main
from hpctrain.data_tools.readers import SOURCES
from hpctrain.data_tools.sources import SourceError
from hpctrain.data import ShardSet, read_index

pytestmark = pytest.mark.usefixtures("plugin_sandbox")   # registrations undone after each test
NAME = "examples.plugins.csv_source:csv"


def read_all(d, split):
    s = ShardSet(read_index(d), split)
    x, y = s.read_range(0, s.num_samples)
    s.close()
    return x, y


def test_convert_from_the_command_line_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    rows = [[f"{v:.6g}" for v in rng.standard_normal(4)] + [str(int(rng.integers(0, 3)))] for _ in range(40)]
    path = tmp_path / "t.csv"
    path.write_text("a,b,c,d,label\n" + "\n".join(",".join(r) for r in rows) + "\n")
    out = str(tmp_path / "out")
    assert tools_main(["convert", "--from", NAME, str(path), "--out", out, "--test-fraction", "0.25",
                       "--no-progress"]) == 0
    with open(path, newline="") as fh:
        truth = sorted((tuple(np.float32([float(v) for v in r[:-1]])), int(r[-1])) for r in list(csv.reader(fh))[1:])
    got = []
    for split, n in (("train", 30), ("test", 10)):
        x, y = read_all(out, split)
        assert x.shape == (n, 4) and x.dtype == np.float32
        got += [(tuple(a), int(b)) for a, b in zip(x, y)]
    assert sorted(got) == truth
    assert read_index(out).class_names == ["0", "1", "2"]


def test_bad_csv_is_one_line(tmp_path):
    (tmp_path / "bad.csv").write_text("1,2,0\n3,x,1\n")
    with pytest.raises(SourceError, match=r"bad.csv: not a CSV of numbers"):
        SOURCES[NAME](str(tmp_path / "bad.csv"))
    (tmp_path / "frac.csv").write_text("1,2,0.5\n")
    with pytest.raises(SourceError, match=r"frac.csv: the last column holds the labels and must be whole numbers$"):
        SOURCES[NAME](str(tmp_path / "frac.csv"))
    with pytest.raises(SystemExit) as err:               # argparse: one "invalid choice" line, status 2
        tools_main(["convert", "--from", "examples.plugins.csv_source:tsv", str(tmp_path / "bad.csv"),
                    "--out", str(tmp_path / "o")])
    assert err.value.code == 2
