"""The run's configuration schema: one dataclass per ``[section]``, one field per key, each with its
default, one-line help and (for numbers) its :class:`~hpctrain.config.values.Range` or (for a
choice) its registry. What reads and checks a Config is :mod:`hpctrain.job.config`.

The top of the house: this module imports every registry directly (hence torch and MPI), and
nothing below the job imports it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hpctrain.api import DEVICES
from hpctrain.comm import COMPRESSIONS, STRATEGIES
from hpctrain.comm.tuner import TUNES
from hpctrain.config.plugins import plugin_tables, recorded_tables, tables_field
from hpctrain.config.values import FRACTION, INF, LOSS_SCALE, LR, NON_NEGATIVE, POSITIVE, Range, opt
from hpctrain.data.augment import KINDS as AUGMENT_KINDS
from hpctrain.data.factory import DECODES, READERS
from hpctrain.data.hdf5 import DRIVERS
from hpctrain.data.shards import VERIFY_MODES
from hpctrain.models.compiled import COMPILE_MODES
from hpctrain.ops.collapse import ON_COLLAPSE
from hpctrain.optim import OPTIMIZERS
from hpctrain.optim.recipe import RECIPES
from hpctrain.optim.schedules import KINDS as SCHEDULE_KINDS
from hpctrain.optim.schedules import WARMUPS
from hpctrain.trainer import AUTOCAST_DTYPES
from hpctrain.update import ALGORITHMS


@dataclass
class DataConfig:
    dataset: str = opt("digits", "'digits' (bundled scikit-learn digits), 'signal1d', 'tabular', 'spirals' or "
                       "'pulses' (generated, data_tools/synthetic.py) or 'package.module:name' (a data-source "
                       "plugin that needs no file), converted on first use, or a shard directory")
    cache_dir: str = opt("~/.cache/hpctrain", "where built-in datasets are converted to shards")
    block_size: int = opt(32, "samples per contiguous block in the per-epoch shuffle plan", range=POSITIVE)
    shuffle_window: int = opt(1024, "samples shuffled together in memory after contiguous reads",
                              range=NON_NEGATIVE)
    prefetch: int = opt(2, "batches prepared ahead by the background reader", range=NON_NEGATIVE)
    lanes: int = opt(0, "lanes the epoch's sample sequence is dealt to, each giving train.batch_size / lanes "
                        "samples to every global batch: fixed, the run (samples, augmentation) is the same at any "
                        "rank count dividing it and resumes on another one; 0: one per rank (docs/data.md)",
                     range=NON_NEGATIVE)
    augment: bool = opt(False, "train-time augmentation (pad-crop, flip)")
    drop_last: bool = opt(True, "drop the last partial global batch of an epoch")
    augment_kind: str = opt("auto", "augmentation: auto (padcrop up to 64 px, rrc above) | padcrop | rrc | flip",
                            choices=AUGMENT_KINDS)
    augment_flip: bool = opt(True, "random horizontal flips in the augmentation (off for digits, text)")
    reader: str = opt("rank", "rank: each rank reads its batches | node: one reader per node fills an MPI-3 "
                              "shared-memory window", choices=READERS)
    hdf5_driver: str = opt("auto", "auto (parallel HDF5 'mpio' when h5py has MPI) | mpio | serial (per-shard "
                                   "files, pread of contiguous datasets)", choices=DRIVERS)
    verify: str = opt("shared", "checksums against index.json: index v3/v4 block digests, metadata blocks at "
                                "open and each data block as it is first read; v1/v2 whole files at open: shared (each "
                                "shard by one rank, once per job) | node (each node checks its own copy) | off",
                      choices=VERIFY_MODES)
    workers: int = opt(0, "JPEG decode threads per rank: 0 = auto (the cores of the rank's CPU affinity; shared "
                          "among the node's ranks when they are not bound to cores)", range=Range(0, 64))
    decode: str = opt("auto", "JPEG decode: auto (gpu when the job trains on CUDA and torchvision imports) | cpu | "
                              "gpu (nvJPEG through torchvision, crops on the device)",
                      choices=DECODES)


@dataclass
class ModelConfig:
    name: str = opt("digits_cnn", "built-in model name or 'package.module:factory'")
    batchnorm: bool = opt(True, "use BatchNorm in the built-in small models")
    zero_init_residual: bool = opt(False, "zero-init the last BN gamma of each residual block")
    compile: bool = opt(False, "torch.compile the model's forward after it is built and broadcast (in place: "
                        "checkpoints keep the plain model's keys; a CPU needs a C++ compiler; docs/getting-started.md)")
    compile_mode: str = opt("default", "torch.compile mode: {choices}", choices=COMPILE_MODES)

    bn_group: int = opt(0, "ghost BatchNorm: training statistics over fixed groups of this many consecutive samples "
                           "of the global batch, the same at any rank count it divides the local batch of; "
                           "0: over each rank's local batch (docs/data.md)", range=NON_NEGATIVE)


@dataclass
class TrainConfig:
    epochs: int = opt(12, "training epochs", range=POSITIVE)
    batch_size: int = opt(64, "GLOBAL batch size (split evenly over ranks)", range=POSITIVE)
    seed: int = opt(0, "seed for initialisation and the data plan (same on every rank)", range=Range(0, 2**32 - 1))
    threads: int = opt(1, "torch intra-op threads per rank", range=POSITIVE)
    eval_every: int = opt(0, "evaluate every N epochs (0: only at the end)", range=NON_NEGATIVE)
    max_steps: int = opt(0, "stop after this many optimiser steps (0: no limit)", range=NON_NEGATIVE)
    device: str = opt("auto", "where model, batches and gradients live: auto (cuda:<local rank mod visible "
                              "GPUs> when torch sees CUDA, else cpu) | cpu | cuda",
                      choices=DEVICES)
    cudnn_benchmark: bool = opt(True, "GPU: cuDNN picks the fastest convolution algorithms per input shape "
                                      "(not bitwise reproducible run to run)")
    tf32: bool = opt(False, "GPU: fp32 matmuls in TensorFloat-32 on Ampere and newer (faster, 10-bit mantissa)")
    channels_last: bool = opt(False, "the model in channels-last (NHWC) memory layout (GPU tensor cores)")
    collapse_steps: int = opt(100, "a collapse: the training loss, once at half the chance level ln(classes) or "
                              "below, back at 0.9 ln(classes) or above for this many steps; and a run that never "
                              "left chance, judged at its end after the warm-up plus this many steps (0: neither "
                              "is checked; docs/operations.md)", range=NON_NEGATIVE)
    on_collapse: str = opt("stop", "on a collapse or a run that never left chance: stop (one line, exit status 6) | "
                           "warn (the line, then go on)",
                           choices=ON_COLLAPSE)


@dataclass
class OptimConfig:
    name: str = opt("sgd", "optimiser: {choices}", choices=OPTIMIZERS)
    recipe: str = opt("none", "none: lr, lars.eta, warm-up and schedule as given | auto: the large-batch table "
                      "(docs/large-batch.md) sets them from the global batch, the optimiser and whether the model "
                      "normalises (lars, lamb)", choices=RECIPES)
    lr: float = opt(0.4, "base learning rate at base_batch (linear scaling rule applied if scale_lr)", range=LR)
    base_batch: int = opt(256, "batch size at which lr is given", range=POSITIVE)
    scale_lr: bool = opt(True, "linear scaling rule: lr * global_batch / base_batch")
    momentum: float = opt(0.9, "momentum", range=FRACTION)
    weight_decay: float = opt(1e-4, "weight decay (never on BN/bias when exclusion is on)", range=Range(0, 1))
    nesterov: bool = opt(False, "Nesterov momentum")
    schedule: str = opt("cosine", "decay after warmup: {choices}",
                        choices=SCHEDULE_KINDS)
    warmup: str = opt("linear", "warmup: {choices}", choices=WARMUPS)
    warmup_epochs: float = opt(1.0, "warmup length in epochs", range=Range(0, 1e5))
    hybrid_hold_epochs: float = opt(-1.0, "hybrid warmup: epochs held at the peak after warmup (<0: = warmup_epochs)",
                                    range=Range(-1, 1e5))
    poly_power: float = opt(2.0, "power of the polynomial decay", range=Range(0, 100, lo_open=True))
    end_lr: float = opt(1e-4, "final learning rate of poly/cosine decay", range=Range(0, 1e3))
    step_epochs: list = opt([], "epochs at which step decay multiplies lr by step_gamma", range=Range(0, 1e5))
    step_gamma: float = opt(0.1, "step decay factor", range=Range(0, 1, lo_open=True))
    label_smoothing: float = opt(0.0, "label smoothing of the cross-entropy loss", range=FRACTION)
    exclude_1d: bool = opt(True, "exclude 1-D parameters (BN, bias) from weight decay (every optimiser) and "
                           "from the trust ratio (LARS, LAMB)")
    lr_1d_scale: float = opt(1.0, "LARS/LAMB: lr multiplier of the 1-D parameters excluded from the trust ratio "
                             "(1: the raw lr, as MLPerf; too large for a BN-free net, docs/large-batch.md)",
                             range=Range(0, 1))
    options: dict = plugin_tables(OPTIMIZERS, "[optim.NAME]: the options of optimiser NAME")


@dataclass
class CommConfig:
    strategy: str = opt("auto", "gradient allreduce strategy: {choices}; auto: hierarchical where a node holds "
                        "several ranks, else flat (README table)", choices=STRATEGIES)
    compression: str = opt("none", "wire compression: {choices}", choices=COMPRESSIONS)
    ranks_per_node: int = opt(0, "emulate K ranks per node (0: real nodes via COMM_TYPE_SHARED)", range=NON_NEGATIVE)
    bucket_mb: float = opt(25.0, "fusion bucket size in MB", range=Range(0, 65536, lo_open=True))
    overlap: bool = opt(False, "start bucket allreduces during backward (off: measured faster on CPU "
                        "hosts, README)")
    tune: str = opt("measure", "per bucket, MPI's allreduce or the ring: measure (time both at start-up) "
                    "| static (a fixed size rule)", choices=TUNES)
    delay_ms: float = opt(0.0, "inject this latency into every gradient allreduce (testing: an emulated slow link)",
                          range=Range(0, 60000))
    options: dict = plugin_tables(COMPRESSIONS, "[comm.NAME]: the options of codec NAME")

@dataclass
class UpdateConfig:
    algorithm: str = opt("ssgd", "update algorithm: {choices}; ssgd: synchronous, odsgd: one-step delay",
                         choices=ALGORITHMS)
    options: dict = plugin_tables(ALGORITHMS, "[update.NAME]: the options of algorithm NAME")

@dataclass
class PrecisionConfig:
    compute: str = opt("fp32", "compute precision: {choices} (autocast where supported)",
                       choices=AUTOCAST_DTYPES)
    loss_scale: str = opt("none", "loss scaling: none | dynamic | a fixed number", range=LOSS_SCALE)
    init_scale: float = opt(65536.0, "initial dynamic loss scale", range=LOSS_SCALE)
    growth_interval: int = opt(2000, "double the dynamic scale after this many clean steps", range=POSITIVE)


@dataclass
class PolishConfig:
    bn_recompute: bool = opt(False, "Final Polishing: recompute BN statistics on un-augmented training data")
    bn_batches: int = opt(0, "batches per rank for the BN recompute (0: one full epoch)", range=NON_NEGATIVE)
    unaugmented_epochs: int = opt(0, "Final Polishing: train the last N epochs without augmentation",
                                  range=NON_NEGATIVE)


@dataclass
class CheckpointConfig:
    every_steps: int = opt(0, "write a checkpoint every N steps (0: only at the end / on signal)", range=NON_NEGATIVE)
    keep: int = opt(3, "checkpoints kept", range=Range(1, INF))
    dir: str = opt("", "checkpoint directory (default RUN_DIR/checkpoints)")
    resume: str = opt("", "'auto' (newest valid checkpoint), a checkpoint path, or '' (fresh start)")


@dataclass
class RunConfig:
    run_dir: str = opt("runs/latest", "directory for metrics.jsonl, timeline and checkpoints")
    progress: bool = opt(True, "tqdm progress bar on rank 0")
    timeline: bool = opt(False, "write a Chrome-trace timeline of every rank's phases")
    watchdog_s: float = opt(300.0, "report ranks that have not reached a collective after N s (0: off)",
                            range=Range(0, 86400))
    watchdog_abort_s: float = opt(900.0, "end the job (status 4) after N s without progress, 3x that in "
                                  "start-up, checkpoint writes and evaluation (0: never)", range=Range(0, 7 * 86400))


@dataclass
class ReportConfig:
    tensorboard: bool = opt(False, "rank 0 writes TensorBoard event files to RUN_DIR/tensorboard (needs the "
                            "tensorboard package: pip install 'hpctrain[tensorboard]')")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    polish: PolishConfig = field(default_factory=PolishConfig)
    ckpt: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)
    report: ReportConfig = field(default_factory=ReportConfig)

    def to_dict(self) -> dict:
        """``{section: {key: value}}``, every key with the value the run uses; a plugin's options as
        its sub-table (``update.odsgd``): all of the chosen plugin's (:func:`recorded_tables`)."""
        out = dataclasses.asdict(self)
        for name, sec in sections(self):
            f = tables_field(sec)
            if f is not None:
                del out[name][f.name]
                out[name].update(recorded_tables(sec))
        return out


def sections(cfg: Config) -> Iterator[tuple[str, Any]]:
    """Yield ``(section_name, section_dataclass_instance)``."""
    for f in dataclasses.fields(cfg):
        yield f.name, getattr(cfg, f.name)
