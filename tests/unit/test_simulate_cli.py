"""`python -m hpctrain simulate`: printed table, JSON, plot, calibration and validation output."""
import json

import pytest

from hpctrain.tools.sim.cli import main


def _table_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line[:1].isdigit()]


def test_prints_one_row_per_power_of_two(capsys):
    assert main(["--nodes", "2", "--gpus-per-node", "4", "--net", "roce-25g"]) == 0
    out = capsys.readouterr().out
    assert "images/s" in out and "eff %" in out
    rows = _table_rows(out)
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8]
    assert [int(r[1]) for r in rows] == [1, 1, 1, 2]
    assert float(rows[0][6]) == pytest.approx(100.0)
    assert float(rows[0][5].replace(",", "")) == pytest.approx(1200, abs=1)   # V100 amp figure


def test_json_and_plot(tmp_path, capsys):
    js, png = tmp_path / "s.json", tmp_path / "s.png"
    assert main(["--nodes", "4", "--model", "vgg16", "--device", "p100", "--precision", "fp32",
                 "--json", str(js), "--plot", str(png)]) == 0
    data = json.loads(js.read_text())
    assert [r["gpus"] for r in data["rows"]] == [1, 2, 4, 8, 16]
    assert data["scenario"]["model"] == "vgg16"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_calibrate_replaces_links(tmp_path, capsys):
    alpha, beta = 20e-6, 1 / 1e9
    rows = [{"impl": "flat", "compression": "none", "ranks_per_node": 2, "bytes": n,
             "time_s": 2 * alpha + n * beta, "algbw_GBps": 0.0, "busbw_GBps": 0.0}
            for n in (1e3, 1e5, 1e7)]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(rows))
    js = tmp_path / "out.json"
    assert main(["--calibrate", str(path), "--calib-ranks", "2", "--device", "cpu", "--nodes", "2",
                 "--gpus-per-node", "1", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "α = 20.00 µs" in out and "R² = 1.0000" in out
    assert json.loads(js.read_text())["calibration"]["alpha_s"] == pytest.approx(alpha)
    assert main(["--calibrate", str(tmp_path / "missing.json")]) == 2


def test_validate_table(tmp_path, capsys):
    js = tmp_path / "v.json"
    assert main(["--validate", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "seed000" in out and "goyal" in out and "horovod-vgg16-512xP100" in out
    for r in json.loads(js.read_text())["validation"]:
        assert r["error_pts"] == pytest.approx(abs(r["predicted_pct"] - r["published_pct"]))
        line = next(l for l in out.splitlines() if l.startswith(r["case"] + " "))
        assert float(line.split()[5]) == pytest.approx(r["error_pts"], abs=0.051)
