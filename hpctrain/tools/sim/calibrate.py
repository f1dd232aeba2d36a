"""Fit α and β of an allreduce implementation to ``hpctrain bench allreduce --json`` rows.

Each row is a dict {"impl", "compression", "ranks_per_node", "bytes", "time_s", "algbw_GBps",
"busbw_GBps"} and should carry "world_size"; rows without it take ``ranks`` (``--calib-ranks``).
"bytes" is the fp32 buffer the caller reduces, whatever the implementation puts on the wire.

Every cost formula in :mod:`hpctrain.tools.sim.costs` is linear in (α, β) once γ is folded into β, so
t = α·A(p, n) + β·B(p, n) with A, B obtained by evaluating the formula with unit links. The fit
minimises relative residuals (rows weighted by 1/t), so microsecond and second rows count alike;
a negative α (latency below resolution) is refitted with α = 0. Quality: R² on time and the largest
|t_pred − t| / t.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from hpctrain.tools.sim.costs import ALGORITHMS, Link

__all__ = ["CalibrationFit", "load_rows", "select_rows", "fit_alpha_beta"]


@dataclass(frozen=True)
class CalibrationFit:
    impl: str
    compression: str
    algo: str
    n_rows: int
    alpha_s: float
    beta_s_per_byte: float
    r2: float
    max_rel_residual: float

    @property
    def bandwidth_GB_s(self) -> float:
        return 1e-9 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else float("inf")

    def link(self) -> Link:
        return Link(self.alpha_s, self.beta_s_per_byte, 0.0)


def load_rows(path: str) -> list[dict]:
    """The JSON list written by ``hpctrain bench allreduce --json``."""
    with open(path) as f:
        rows = json.load(f)
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON list of benchmark rows")
    return rows


def select_rows(rows: list[dict], impl: str, compression: str = "none", ranks: int | None = None,
                min_bytes: float = 0.0) -> list[tuple[int, float, float]]:
    """(world size, bytes, seconds) of the rows for one implementation and compression, from
    ``min_bytes`` up (fit the sizes that matter: a CPU allreduce of cache-resident buffers runs
    at twice the bandwidth of a DRAM-bound one, which no single β describes)."""
    out = []
    for r in rows:
        if r.get("impl") != impl or r.get("compression", "none") != compression:
            continue
        if float(r["bytes"]) < min_bytes:
            continue
        p = r.get("world_size", ranks)
        if p is None:
            raise ValueError("benchmark row has no world_size: pass --calib-ranks N")
        out.append((int(p), float(r["bytes"]), float(r["time_s"])))
    if not out:
        seen = sorted({(r.get("impl"), r.get("compression", "none")) for r in rows})
        raise ValueError(f"no rows for impl={impl!r} compression={compression!r} with bytes ≥ "
                         f"{min_bytes:g}; file has {seen}")
    return out


def _design(points: list[tuple[int, float, float]], algo: str) -> tuple[np.ndarray, np.ndarray]:
    cost = ALGORITHMS[algo]
    a = [cost(p, n, Link(1.0, 0.0)) for p, n, _ in points]
    b = [cost(p, n, Link(0.0, 1.0)) for p, n, _ in points]
    return np.column_stack([a, b]), np.array([t for _, _, t in points])


def fit_alpha_beta(points: list[tuple[int, float, float]], algo: str = "ring", *,
                   impl: str = "", compression: str = "none") -> CalibrationFit:
    """Least-squares α, β of ``algo``'s formula over (world size, bytes, seconds) points."""
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}; choose from {sorted(ALGORITHMS)}")
    X, t = _design(points, algo)
    if np.any(t <= 0) or np.any(X[:, 1] <= 0):
        raise ValueError("calibration needs positive times and world size ≥ 2 on every row")
    w = 1.0 / t
    coef, *_ = np.linalg.lstsq(X * w[:, None], t * w, rcond=None)
    if coef[0] < 0:
        coef = np.array([0.0, float(np.sum(X[:, 1] * t * w**2) / np.sum((X[:, 1] * w) ** 2))])
    pred = X @ coef
    ss_res = float(np.sum((t - pred) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else float(ss_res == 0)
    return CalibrationFit(impl, compression, algo, len(points), float(coef[0]), float(coef[1]),
                          r2, float(np.max(np.abs(pred - t) / t)))
