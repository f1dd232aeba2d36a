"""Step time of synchronous data-parallel SGD on n GPUs, and the scaling table built from it.

Per step and GPU (all pure arithmetic on a frozen :class:`Scenario`):
  compute   batch / (achieved images/s on one device), or a measured ``step_time_s``; split
            forward : backward = 1 : 2 (backward costs ≈ 2 × forward MACs).
  comm      gradients in equal buckets of ``bucket_mb`` (PyTorch DDP's default is 25 MB, Horovod's
            fusion buffer 64 MB); each bucket is one allreduce priced by :mod:`hpctrain.tools.sim.costs`.
  overlap   bucket i is ready at i/k of the backward pass (gradients assumed produced uniformly in
            bytes); buckets are reduced one at a time, each starting when it is ready and the
            previous one is done. The exposed time is what runs past the end of backward: at least
            the last bucket, and everything that does not fit behind backward. (This is the rule
            "all but the last bucket hide behind backward, up to the backward time", except that a
            bucket cannot start before it exists.) Without overlap every bucket runs after backward.
  loading   the input pipeline prefetches, so it costs only if slower than the rest:
            step = max(compute + exposed comm, batch / loader images/s).
  stragglers optional: synchronous SGD waits for the slowest of n workers; with per-step compute
            times normal with coefficient of variation cv, the expected maximum is
            mean·(1 + cv·z_n), z_n = Φ⁻¹((n − 0.375)/(n + 0.25)) (Blom's approximation).
Scaling efficiency at n GPUs = (images/s at n / n) / (images/s at the baseline / baseline).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

from hpctrain.tools.sim.costs import Link, allreduce_s
from hpctrain.tools.sim.presets import DEVICES, INTRA, MODELS, NETWORKS, images_per_s

__all__ = ["Scenario", "Prediction", "compute_time_s", "scenario_links", "bucket_sizes",
           "exposed_comm_s", "straggler_factor", "predict", "gpu_counts", "scaling_table"]

IMAGENET_TRAIN_IMAGES = 1_281_167


@dataclass(frozen=True)
class Scenario:
    """Everything one prediction depends on; ``*_link`` override presets (calibration)."""

    model: str = "resnet50"
    device: str = "v100"
    precision: str = "amp"
    batch_per_gpu: int | None = None  # None: the batch the device figure was measured at
    gpus_per_node: int = 4
    net: str = "ib-edr"
    intra: str = "nvlink-v100"
    nics_per_node: int = 1
    algo: str = "hierarchical"
    inter_algo: str = "ring"
    compression: str = "none"
    bucket_mb: float = 25.0
    overlap: bool = True
    step_time_s: float | None = None
    loader_img_s: float = 0.0
    straggler_cv: float = 0.0
    params_m: float | None = None
    inter_link: Link | None = None
    intra_link: Link | None = None
    inter_alpha_s: float | None = None  # per-message latency overrides (applied last)
    intra_alpha_s: float | None = None


@dataclass(frozen=True)
class Prediction:
    gpus: int
    nodes: int
    batch_per_gpu: int
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    load_s: float
    step_s: float
    images_per_s: float


def compute_time_s(sc: Scenario) -> tuple[float, int, str]:
    """(fwd+bwd+update seconds for one GPU's batch, that batch, where the figure comes from)."""
    if sc.step_time_s is not None:
        if sc.batch_per_gpu is None:
            raise ValueError("a measured step time needs the batch it was measured at (--batch-per-gpu)")
        return sc.step_time_s, sc.batch_per_gpu, "measured (--step-time-s)"
    rate, batch, src = images_per_s(sc.device, sc.model, sc.precision)
    batch = sc.batch_per_gpu or batch
    return batch / rate, batch, src


def scenario_links(sc: Scenario) -> tuple[Link, Link]:
    """(intra, inter) links: presets with the device's reduction cost γ, or calibrated links,
    then the α overrides."""
    gamma = DEVICES[sc.device].gamma_s_per_byte
    intra = sc.intra_link or INTRA[sc.intra].link(gamma)
    inter = sc.inter_link or NETWORKS[sc.net].link(gamma)
    if sc.intra_alpha_s is not None:
        intra = replace(intra, alpha_s=sc.intra_alpha_s)
    if sc.inter_alpha_s is not None:
        inter = replace(inter, alpha_s=sc.inter_alpha_s)
    return intra, inter


def bucket_sizes(total_bytes: float, bucket_bytes: float) -> list[float]:
    """k = ⌈total / bucket⌉ equal buckets."""
    k = max(1, math.ceil(total_bytes / bucket_bytes))
    return [total_bytes / k] * k


def exposed_comm_s(bucket_comm_s: list[float], backward_s: float, overlap: bool = True) -> float:
    """Communication time left after backward ends (see the module docstring)."""
    if not overlap:
        return sum(bucket_comm_s)
    k, done = len(bucket_comm_s), 0.0
    for i, c in enumerate(bucket_comm_s, start=1):
        done = max(done, backward_s * i / k) + c
    return done - backward_s


def straggler_factor(n: int, cv: float) -> float:
    """Expected max of n normal step times over their mean, 1 + cv·z_n (Blom)."""
    if n <= 1 or cv <= 0:
        return 1.0
    return 1.0 + cv * NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def _layout(n: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, ranks per node) for n GPUs filling nodes in order."""
    per_node = min(n, gpus_per_node)
    return math.ceil(n / per_node), per_node


def predict(sc: Scenario, n: int) -> Prediction:
    """Predicted step of ``sc`` on ``n`` GPUs."""
    compute, batch, _ = compute_time_s(sc)
    compute *= straggler_factor(n, sc.straggler_cv)
    nodes, per_node = _layout(n, sc.gpus_per_node)
    intra, inter = scenario_links(sc)
    params_m = sc.params_m if sc.params_m is not None else MODELS[sc.model].params_m
    conv = DEVICES[sc.device].fp16_convert_s_per_elem
    costs = [allreduce_s(sc.algo, nodes, per_node, b, intra, inter, inter_algo=sc.inter_algo,
                         nics_per_node=sc.nics_per_node, compression=sc.compression,
                         convert_s_per_elem=conv)
             for b in bucket_sizes(params_m * 1e6 * 4, sc.bucket_mb * 1e6)]
    exposed = exposed_comm_s(costs, compute * 2 / 3, sc.overlap) if n > 1 else 0.0
    load = batch / sc.loader_img_s if sc.loader_img_s > 0 else 0.0
    step = max(compute + exposed, load)
    return Prediction(n, nodes, batch, compute, sum(costs) if n > 1 else 0.0, exposed, load, step,
                      n * batch / step)


def gpu_counts(max_gpus: int) -> list[int]:
    """1, 2, 4, … up to max_gpus, plus max_gpus itself when it is not a power of two."""
    counts = [1 << i for i in range(max_gpus.bit_length()) if (1 << i) <= max_gpus]
    return counts if counts[-1] == max_gpus else counts + [max_gpus]


def scaling_table(sc: Scenario, counts: list[int], *, baseline_gpus: int = 1, epochs: float = 90,
                  dataset_size: int = IMAGENET_TRAIN_IMAGES) -> list[dict]:
    """One row per GPU count: step, comm, images/s, efficiency vs the baseline, time to train, and
    seed 000's average single-GPU time per epoch (wall × GPUs / epochs)."""
    base = predict(sc, baseline_gpus)
    per_gpu_base = base.images_per_s / baseline_gpus
    rows = []
    for n in counts:
        p = predict(sc, n)
        wall_s = epochs * dataset_size / p.images_per_s
        rows.append({
            "gpus": n, "nodes": p.nodes, "step_ms": p.step_s * 1e3, "compute_ms": p.compute_s * 1e3,
            "comm_ms": p.comm_s * 1e3, "exposed_comm_ms": p.exposed_comm_s * 1e3,
            "load_ms": p.load_s * 1e3, "images_per_s": p.images_per_s,
            "efficiency_pct": 100.0 * p.images_per_s / n / per_gpu_base,
            "time_to_train_h": wall_s / 3600, "gpu_h_per_epoch": wall_s * n / epochs / 3600,
        })
    return rows
