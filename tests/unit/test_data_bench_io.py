"""``hpctrain bench io`` end to end on a tiny dataset: every row is measured and the table printed."""
import json

from hpctrain.tools.bench.io import main


def test_bench_io_tiny(tmp_path, capsys):
    out = tmp_path / "io.json"
    args = ["--size-gb", "0.005", "--small-gb", "0.001", "--dir", str(tmp_path / "ds"), "--no-cold", "--rounds", "2",
            "--random-samples", "20", "--job-steps", "5", "--json", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    methods = {(r["data"], r["method"].split(",")[0]) for r in rows}
    assert ("3x224x224", "block plan") in methods and ("3x32x32", "per-sample random h5py reads (anti-pattern)") in methods
    assert all(r["samples_per_s"] > 0 and r["cache"] == "warm" for r in rows)
    big = [r for r in rows if r["data"] == "3x224x224" and r["method"].startswith(("block plan", "first epoch"))]
    assert len(big) == 6 and all(r["samples"] == big[0]["samples"] for r in big)   # same epoch, six readers
    assert [r["rounds"] for r in big[:4]] == [2] * 4 and big[0]["method"].startswith("block plan, per-rank reading, serial")
    check = [r for r in rows if r["method"].startswith("whole-file SHA-256 check at open")]
    assert len(check) == 1 and check[0]["data"] == "3x224x224" and check[0]["mb_per_s"] > 0
    assert len([r for r in rows if r["method"].startswith("full loader")]) == 2
    assert "integrity (warm): first epoch with per-block XXH3-128 as read (v5, row-aligned grid)" in text and "SHA-256 (v3)" in text and "later epochs 100 %" in text
    assert "data-wait share" in text and "vs random" in text
    assert main(args) == 0 and "generated" not in capsys.readouterr().out          # reused, not regenerated
    assert main(["--clean", "--dir", str(tmp_path / "ds")]) == 0 and not (tmp_path / "ds").exists()
