"""The update-algorithm benchmark's arithmetic (`bench sync`, hpctrain/tools/bench/update.py): per-step phases,
the hidden share, the table."""
import pytest

from hpctrain.tools.bench import update as bench


def test_phase_ms_groups_spans_per_step():
    totals = {"forward": 0.2, "backward": 0.4, "allreduce": 0.1, "optimizer": 0.05, "local_update": 0.03,
              "data": 9.0}
    assert bench.phase_ms(totals, 10) == pytest.approx({"forward": 20.0, "backward": 40.0, "comm": 10.0,
                                                        "update": 8.0})


def test_hidden_share():
    assert bench.hidden_share(40.0, 10.0) == pytest.approx(0.75)
    assert bench.hidden_share(40.0, 50.0) == pytest.approx(-0.25)      # waited longer: not hidden
    assert bench.hidden_share(0.0, 1.0) == 0.0


def test_table_has_a_row_per_run_and_ratios():
    rows = [{"algorithm": a, "delay_ms": 0.0, "steps_per_s": s, "speedup": s / 2.0, "step_ms": 1e3 / s,
             "forward": 1.0, "backward": 2.0, "comm": c, "update": 0.5, "comm_share": c * s / 1e3, "hidden": h}
            for a, s, c, h in (("ssgd", 2.0, 200.0, None), ("odsgd", 3.0, 50.0, 0.75))]
    lines = bench.format_table(rows).splitlines()
    assert len(lines) == 4 and "x SSGD" in lines[0]
    assert lines[3].split()[:4] == ["0", "odsgd", "3.00", "1.50"] and lines[3].endswith("75%")
    assert lines[2].split()[-1] == "-" and lines[2].split()[-2] == "40%"


def test_bad_arguments_exit():
    with pytest.raises(SystemExit):
        bench.parse_args(["--comm-delay-ms", "-1"])


def test_speedup_is_the_median_of_paired_runs():
    # load drift: both algorithms slow down together in the second pair; pairs keep the ratio
    assert bench.pair_speedup([10.0, 5.0, 10.0], [12.0, 6.0, 30.0]) == pytest.approx(1.2)
