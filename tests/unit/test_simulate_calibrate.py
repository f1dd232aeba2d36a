"""Calibration recovers known α, β from synthetic `bench allreduce --json` rows."""
import json

import numpy as np
import pytest

from hpctrain.tools.sim.calibrate import fit_alpha_beta, load_rows, select_rows

ALPHA, BETA = 7e-6, 1 / 2.5e9   # 7 µs, 2.5 GB/s


def _ring_time(p, n):  # written out here, independently of hpctrain.tools.sim.costs
    return 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n * BETA


def _bench_rows(noise=0.0, world_size=True, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for p in (2, 4):
        for n in [2 ** k for k in range(10, 27, 2)]:
            t = _ring_time(p, n) * (1 + noise * rng.standard_normal())
            row = {"impl": "flat", "compression": "none", "ranks_per_node": p, "bytes": n,
                   "time_s": t, "algbw_GBps": n / t / 1e9, "busbw_GBps": 2 * (p - 1) / p * n / t / 1e9}
            if world_size:
                row["world_size"] = p
            rows.append(row)
    # rows of other implementations must be ignored
    rows.append({"impl": "gloo", "compression": "none", "ranks_per_node": 2, "bytes": 1024,
                 "time_s": 1.0, "algbw_GBps": 0.0, "busbw_GBps": 0.0, "world_size": 2})
    return rows


def test_recovers_alpha_beta_exactly_from_clean_rows(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_bench_rows()))
    fit = fit_alpha_beta(select_rows(load_rows(str(path)), "flat"), "ring", impl="flat")
    assert fit.alpha_s == pytest.approx(ALPHA, rel=1e-6)
    assert fit.beta_s_per_byte == pytest.approx(BETA, rel=1e-6)
    assert fit.bandwidth_GB_s == pytest.approx(2.5, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12) and fit.max_rel_residual < 1e-6
    assert fit.n_rows == 18


def test_noisy_rows_give_close_fit_and_honest_error():
    fit = fit_alpha_beta(select_rows(_bench_rows(noise=0.02), "flat"), "ring")
    assert fit.alpha_s == pytest.approx(ALPHA, rel=0.15)
    assert fit.beta_s_per_byte == pytest.approx(BETA, rel=0.05)
    assert fit.r2 > 0.99 and 0.005 < fit.max_rel_residual < 0.2


def test_rows_without_world_size_need_calib_ranks():
    rows = [r for r in _bench_rows(world_size=False) if r["ranks_per_node"] == 4 and r["impl"] == "flat"]
    with pytest.raises(ValueError, match="calib-ranks"):
        select_rows(rows, "flat")
    fit = fit_alpha_beta(select_rows(rows, "flat", ranks=4), "ring")
    assert fit.alpha_s == pytest.approx(ALPHA, rel=1e-6)


def test_missing_impl_names_what_the_file_has():
    with pytest.raises(ValueError, match="gloo"):
        select_rows(_bench_rows(), "hierarchical")


def test_min_bytes_keeps_only_large_rows():
    points = select_rows(_bench_rows(), "flat", min_bytes=1 << 20)
    assert points and all(n >= 1 << 20 for _, n, _ in points)
    assert len(points) == 2 * len([k for k in range(10, 27, 2) if 2 ** k >= 1 << 20])
    with pytest.raises(ValueError, match="bytes"):
        select_rows(_bench_rows(), "flat", min_bytes=1e12)
