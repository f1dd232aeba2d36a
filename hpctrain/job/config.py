"""The run's configuration schema: nested dataclasses, an optional TOML file, and ``--set
key=value`` overrides.

Precedence: dataclass defaults < TOML file (``--config``) < ``--set section.key=value`` < named
flags (``--epochs``…). Every field carries a one-line help text (``help_text``); ``--help`` lists
them all. Bad values raise :class:`ConfigError` whose message names the field — the entry point
prints it as one line on rank 0 and every rank exits with status 2.

Numbers: every int and float field carries a :class:`Range` (shown by ``--help``); NaN and ±inf
are refused for every float field when the value is read (``coerce``), the range by
:func:`validate` (both in :mod:`hpctrain.config.values`). Choice fields hold their registry
(``choices=STRATEGIES``), which :func:`validate` and ``--help`` read, so a strategy, compression,
schedule… added there is accepted and listed here without re-typing the list. A value
``package.module:name`` selects a plugin outside the tree (:mod:`hpctrain.config.registries`). A plugin's
own options live in a sub-table (``[update.odsgd]``) whose schema is the plugin's constructor
(:mod:`hpctrain.config.plugins`).

The top of the house: this module imports every registry directly (hence torch and MPI), and
nothing below the job imports it. :mod:`hpctrain.config` is the layer under it that the plugins
share (values, ranges, a constructor's options); the job resolves a Config into plain keywords
once (:mod:`hpctrain.job.setup`) and the library takes those.

Keys that were renamed are listed once in docs/changelog.md; an old key is an unknown key.
"""
from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Iterator
from typing import Any
from dataclasses import dataclass, field

from hpctrain.api import DEVICES
from hpctrain.comm import COMPRESSIONS, STRATEGIES
from hpctrain.comm.tuner import TUNES
from hpctrain.config.plugins import (help_lines, plugin_tables, recorded_tables, set_option,
                                     table_problems, tables_field)
from hpctrain.config.values import (FRACTION, INF, LOSS_SCALE, LR, NON_NEGATIVE, POSITIVE, Range, coerce,
                                    field_problem, opt, registry)
from hpctrain.data.augment import KINDS as AUGMENT_KINDS
from hpctrain.data.factory import DECODES, READERS
from hpctrain.data.hdf5 import DRIVERS
from hpctrain.data.plan import lane_problem
from hpctrain.data.shards import VERIFY_MODES
from hpctrain.errors import ConfigError
from hpctrain.models.compiled import COMPILE_MODES

from hpctrain.models.ghostbn import group_problem
from hpctrain.ops.collapse import ON_COLLAPSE
from hpctrain.ops.tensorboard import tensorboard_missing
from hpctrain.optim import OPTIMIZERS
from hpctrain.optim.recipe import RECIPES, row_problem
from hpctrain.optim.schedules import KINDS as SCHEDULE_KINDS
from hpctrain.optim.schedules import WARMUPS
from hpctrain.trainer import AUTOCAST_DTYPES
from hpctrain.update import ALGORITHMS

__all__ = ["Config", "ConfigError", "sections", "help_text", "set_value", "load_toml", "validate",
           "DataConfig", "ModelConfig", "TrainConfig", "OptimConfig", "CommConfig", "UpdateConfig", "PrecisionConfig",
           "PolishConfig", "CheckpointConfig", "RunConfig", "ReportConfig"]


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


def _help(f: dataclasses.Field) -> str:
    """A field's help; ``{choices}`` in it becomes its registry's names, read now (``--help``)."""
    text = f.metadata.get("help", "")
    return text.replace("{choices}", " | ".join(registry(f.metadata["choices"]))) if "{choices}" in text else text


def help_text(cfg: Config | None = None) -> str:
    """All keys with type, default, help and range, for ``--help``: each plugin's options too
    (imports the registries, hence torch: call it when the help is printed)."""
    cfg = cfg or Config()
    lines = []
    for name, sec in sections(cfg):
        for f in dataclasses.fields(sec):
            if "plugins" in f.metadata:
                lines += help_lines(sec, name)
                continue
            default = getattr(sec, f.name)
            rng = f.metadata.get("range")
            extra = f" (must be {rng.describe()})" if rng is not None else ""
            lines.append(f"  {name}.{f.name} = {default!r}\n      {_help(f)}{extra}")
    return "\n".join(lines)


def set_value(cfg: Config, dotted: str, value) -> None:
    """Set ``section.key`` (or ``section.plugin.option``) on cfg from a TOML value or a CLI string.
    Errors name the key as given."""
    given = dotted
    section, _, key = dotted.partition(".")
    sec = getattr(cfg, section, None) if section in {n for n, _ in sections(cfg)} else None
    if sec is None or not key:
        raise ConfigError(f"config {given}: unknown key (sections: {', '.join(n for n, _ in sections(cfg))})")
    if "." in key:
        set_option(sec, section, key, value, given)
        return
    hints = typing.get_type_hints(type(sec))
    if key not in hints or key in {f.name for f in dataclasses.fields(sec) if "plugins" in f.metadata}:
        raise ConfigError(f"config {given}: unknown key")
    setattr(sec, key, coerce(given, value, hints[key]))


def load_toml(cfg: Config, path: str) -> None:
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except OSError as exc:                        # a directory, no permission, an I/O error
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:             # TOML is UTF-8 by definition
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} "
                          f"at offset {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    for section, table in doc.items():
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: top-level key {section!r} must be a [section]")
        for key, value in table.items():
            if isinstance(value, dict):           # a plugin's sub-table, [update.odsgd]
                for option, v in value.items():
                    set_value(cfg, f"{section}.{key}.{option}", v)
            else:
                set_value(cfg, f"{section}.{key}", value)


def dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be used (or created) as a directory, or None."""
    p = os.path.abspath(path)
    probe = p
    while not os.path.lexists(probe):         # the nearest existing ancestor decides
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        probe = parent
    if os.path.isdir(probe):
        return None
    if probe == p:
        return f"{path} exists and is not a directory"
    return f"{path}: {probe} is not a directory"


THREADS_PER_CORE = 4     # train.threads: at most this many per core of the node (more only thrash)


def threads_problem(threads: int) -> str | None:
    """Why ``train.threads`` is more than a rank can use (a few per core of this node), or None."""
    cores = os.cpu_count() or 1
    if threads > THREADS_PER_CORE * cores:
        return f"{threads} threads per rank is more than {THREADS_PER_CORE} per core of this node ({cores} cores)"
    return None


def validate(cfg: Config, world_size: int = 1) -> None:
    """Check values that would otherwise fail later, on some ranks, with a traceback (or train on
    NaN): every field's range or choices, then what depends on several fields or the file system."""
    for name, sec in sections(cfg):
        for f in dataclasses.fields(sec):
            problem = field_problem(f, getattr(sec, f.name))
            if problem:
                key = f"{name}.{f.name}"
                raise ConfigError(f"config {key}: {problem}")
        for key, problem in table_problems(sec, name):
            raise ConfigError(f"config {key}: {problem}")
    checks = [   # each computed once, in this order; the first problem stops
        ("train.batch_size", lambda: None if cfg.train.batch_size % world_size == 0 else
         f"global batch {cfg.train.batch_size} is not divisible by {world_size} ranks"),
        ("data.lanes", lambda: lane_problem(cfg.data.lanes, world_size, cfg.train.batch_size)
         if cfg.data.lanes else None),
        ("model.bn_group", lambda: group_problem(cfg.model.bn_group, cfg.train.batch_size, world_size)),
        ("train.threads", lambda: threads_problem(cfg.train.threads)),
        ("run.run_dir", lambda: dir_problem(cfg.run.run_dir)),
        ("ckpt.dir", lambda: cfg.ckpt.dir and dir_problem(cfg.ckpt.dir)),
        ("optim.recipe", lambda: row_problem(cfg.optim.name) if cfg.optim.recipe == "auto" else None),
        ("report.tensorboard", lambda: tensorboard_missing() if cfg.report.tensorboard else None),
    ]
    for key, problem_of in checks:
        problem = problem_of()
        if problem:
            raise ConfigError(f"config {key}: {problem}")
