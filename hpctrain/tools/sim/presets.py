"""Presets for the simulator: networks, intra-node links, models and devices, each with its source.

Every figure here is a published number or a measurement on this machine, and says which. Where no
figure exists the simulator derives one and says how (``note``). Only one constant is a modelling
choice rather than a citation: ``LINK_EFFICIENCY``, the share of a network's signalling rate that a
large allreduce achieves, set once for every network (0.9: ib_write_bw on EDR reaches ~11–12 of
12.5 GB/s, and NCCL's bus bandwidth on 100 Gb/s fabrics is reported near 90 % of line rate).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hpctrain.tools.sim.costs import Link

__all__ = ["LINK_EFFICIENCY", "NetPreset", "IntraPreset", "ModelPreset", "DevicePreset",
           "NETWORKS", "INTRA", "MODELS", "DEVICES", "images_per_s"]

LINK_EFFICIENCY = 0.9


@dataclass(frozen=True)
class NetPreset:
    """An inter-node network: signalling rate [Gbit/s], MPI-level latency α [s]."""

    gbit_s: float
    alpha_s: float
    note: str

    def link(self, gamma_s_per_byte: float = 0.0, efficiency: float = LINK_EFFICIENCY) -> Link:
        return Link(self.alpha_s, 1.0 / (self.gbit_s / 8 * 1e9 * efficiency), gamma_s_per_byte)


@dataclass(frozen=True)
class IntraPreset:
    """An intra-node path: achieved allreduce bus bandwidth [GB/s], latency α [s]."""

    GB_s: float
    alpha_s: float
    note: str

    def link(self, gamma_s_per_byte: float = 0.0) -> Link:
        return Link(self.alpha_s, 1.0 / (self.GB_s * 1e9), gamma_s_per_byte)


NETWORKS = {
    "ib-edr": NetPreset(100, 1.0e-6, "InfiniBand EDR 4x, 100 Gb/s; ~1 µs MPI ping-pong latency"),
    "ib-hdr": NetPreset(200, 1.0e-6, "InfiniBand HDR 4x, 200 Gb/s; ~1 µs"),
    "roce-25g": NetPreset(25, 3.0e-6, "RoCE on 25 GbE (Horovod's 512-GPU benchmark); ~3 µs"),
    "eth-50g": NetPreset(50, 20e-6, "50 GbE, TCP (Goyal et al. 2017, ConnectX-4); ~20 µs"),
    "eth-10g": NetPreset(10, 25e-6, "10 GbE, TCP; ~25 µs"),
    "eth-1g": NetPreset(1, 50e-6, "1 GbE, TCP; ~50 µs"),
}

INTRA = {
    "shm": IntraPreset(5.0, 1e-6, "CPU shared memory, measured here: MPI-3 window reduction of "
                                  "64 MiB over 2 ranks in 12.5 ms (docs/environment.md)"),
    "pcie3": IntraPreset(10.0, 5e-6, "PCIe 3.0 x16 (16 GB/s nominal), ~10 GB/s achieved"),
    "nvlink-p100": IntraPreset(40.0, 5e-6, "NVLink 1 (DGX-1/Big Basin P100), approximate"),
    "nvlink-v100": IntraPreset(100.0, 5e-6, "NVLink 2 (SXM2 V100), approximate"),
    "nvswitch-a100": IntraPreset(230.0, 5e-6, "NVSwitch (DGX A100), approximate"),
}


@dataclass(frozen=True)
class ModelPreset:
    """Parameters [millions] and forward multiply-accumulates per image [G] (the unit in which
    "ResNet-50 is 4.1 GFLOPs" is usually quoted); fwd+bwd ≈ 3 × forward."""

    params_m: float
    fwd_gmac: float
    note: str

    @property
    def grad_bytes(self) -> float:
        return self.params_m * 1e6 * 4  # fp32 gradients


MODELS = {
    "resnet50": ModelPreset(25.557, 4.1, "He et al. 2016; 224² input; torchvision counts"),
    "resnet101": ModelPreset(44.549, 7.8, "He et al. 2016; 224² input"),
    "resnet152": ModelPreset(60.193, 11.5, "He et al. 2016; 224² input"),
    "inception-v3": ModelPreset(23.835, 5.7, "Szegedy et al. 2016; 299² input, no aux head"),
    "vgg16": ModelPreset(138.358, 15.5, "Simonyan & Zisserman 2015; 224² input"),
    "digits_cnn": ModelPreset(0.151402, 0.00133, "hpctrain.models.small.SmallCNN on 8×8 digits "
                                                  "(151,402 parameters; MACs from layer shapes)"),
}

_TF_P100 = ("TensorFlow performance benchmarks (2017), DGX-1 P100, 1 GPU, synthetic data, "
            "batch 64, tf_cnn_benchmarks")
_DLE_V100 = ("NVIDIA DeepLearningExamples PyTorch ResNet50 v1.5 README, DGX-1 V100 16GB, "
             "1 GPU, pytorch-21.03 container")
_DLE_A100 = "NVIDIA DeepLearningExamples PyTorch ResNet50 v1.5 README, DGX A100 80GB, 1 GPU"


@dataclass(frozen=True)
class DevicePreset:
    """Achieved training images/s per device for (model, precision), with sources; memory
    bandwidth [GB/s] prices reductions (γ: read two, write one) and fp16 conversions."""

    mem_GB_s: float
    rates: dict = field(default_factory=dict)  # (model, precision) -> (img/s, batch, source)
    convert_s_per_elem: float | None = None  # measured override of the bandwidth estimate

    @property
    def gamma_s_per_byte(self) -> float:
        return 3.0 / (self.mem_GB_s * 1e9)

    @property
    def fp16_convert_s_per_elem(self) -> float:
        if self.convert_s_per_elem is not None:
            return self.convert_s_per_elem
        return 6.0 / (self.mem_GB_s * 1e9)  # read 4 B + write 2 B per element and direction


DEVICES = {
    "p100": DevicePreset(732, {
        ("resnet50", "fp32"): (238.0, 64, _TF_P100),
        ("inception-v3", "fp32"): (142.0, 64, _TF_P100),
        ("vgg16", "fp32"): (132.0, 64, _TF_P100),
        ("resnet152", "fp32"): (95.6, 64, _TF_P100),
        ("resnet101", "fp32"): (136.0, 64, "interpolated in per-image time vs forward MACs between "
                                       "ResNet-50 and ResNet-152 of: " + _TF_P100),
    }),
    "v100": DevicePreset(900, {
        ("resnet50", "fp32"): (367.0, 112, _DLE_V100 + ", FP32"),
        ("resnet50", "amp"): (1200.0, 256, _DLE_V100 + ", mixed precision"),
    }),
    "a100": DevicePreset(2039, {
        ("resnet50", "fp32"): (938.0, 256, _DLE_A100 + ", TF32"),
        ("resnet50", "amp"): (2470.0, 256, _DLE_A100 + ", mixed precision"),
    }),
    "cpu": DevicePreset(10, {
        ("resnet50", "fp32"): (1.9, 8, "measured here: hpctrain resnet50 fwd+bwd+SGD, 1 torch "
                                   "thread, batch 8, 4.2 s/step on a shared 2-core VM"),
    }, convert_s_per_elem=0.15e-9),  # torch copy_ fp32→fp16: 2.4 ms per 16 M elements (docs/environment.md)
}


def images_per_s(device: str, model: str, precision: str) -> tuple[float, int, str]:
    """(images/s on one device, per-device batch it was measured at, where it comes from).

    Published figure if the table has one; a device without a figure for ``amp`` (P100, CPU: no
    tensor cores) uses its fp32 figure; other models are scaled from the device's ResNet-50 figure
    by forward MACs (crude: on P100, VGG-16 runs at 2× what MAC scaling predicts).
    """
    dev = DEVICES[device]
    for prec in (precision, "fp32"):
        if (model, prec) in dev.rates:
            rate, batch, src = dev.rates[(model, prec)]
            return rate, batch, src if prec == precision else f"{src} (no {precision} figure: fp32)"
    base_prec = precision if ("resnet50", precision) in dev.rates else "fp32"
    base, batch, src = dev.rates[("resnet50", base_prec)]
    scale = MODELS["resnet50"].fwd_gmac / MODELS[model].fwd_gmac
    return base * scale, batch, f"scaled by forward MACs from resnet50: {src}"
