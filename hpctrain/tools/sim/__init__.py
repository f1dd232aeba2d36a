"""Calibrated performance simulator of data-parallel training (``python -m hpctrain simulate``).

Modules: ``costs`` (α-β-γ allreduce formulas), ``presets`` (sourced networks, models, devices),
``step`` (step time, overlap, scaling table), ``calibrate`` (fit α, β to benchmark rows),
``validate`` (published cases), ``report`` (tables, JSON, plots), ``cli`` (the sub-command).
"""
from hpctrain.tools.sim.costs import Link, allreduce_s
from hpctrain.tools.sim.step import Scenario, predict, scaling_table

__all__ = ["Link", "allreduce_s", "Scenario", "predict", "scaling_table"]
