"""Run configuration: nested dataclasses, an optional TOML file, and ``--set key=value`` overrides.

Precedence: dataclass defaults < TOML file (``--config``) < ``--set section.key=value`` < named
flags (``--epochs``…). Every field carries a one-line help text (``help_text``); ``--help`` lists
them all. Bad values raise :class:`ConfigError` whose message names the field — the entry point
prints it as one line on rank 0 and every rank exits with status 2.
"""
from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field (``section.key``)."""


def opt(default, help: str, **kw):
    """A dataclass field with a help text for ``--help``."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass
class DataConfig:
    dataset: str = opt("digits", "'digits' (bundled scikit-learn digits, converted on first use) or a shard directory")
    cache_dir: str = opt("~/.cache/hpctrain", "where built-in datasets are converted to shards")
    block_size: int = opt(32, "samples per contiguous block in the per-epoch shuffle plan")
    shuffle_window: int = opt(1024, "samples shuffled together in memory after contiguous reads")
    prefetch: int = opt(2, "batches prepared ahead by the background reader")
    augment: bool = opt(False, "train-time augmentation (pad-crop, flip)")
    drop_last: bool = opt(True, "drop the last partial global batch of an epoch")
    augment_kind: str = opt("auto", "augmentation: auto (padcrop up to 64 px, rrc above) | padcrop | rrc | flip")
    augment_flip: bool = opt(True, "random horizontal flips in the augmentation (off for digits, text)")
    reader: str = opt("rank", "rank: each rank reads its batches | node: one reader per node fills an MPI-3 "
                              "shared-memory window")
    hdf5_driver: str = opt("auto", "auto (parallel HDF5 'mpio' when h5py has MPI) | mpio | serial (per-shard "
                                   "files, pread of contiguous datasets)")


@dataclass
class ModelConfig:
    name: str = opt("digits_cnn", "built-in model name or 'package.module:factory'")
    batchnorm: bool = opt(True, "use BatchNorm in the built-in small models")
    zero_init_residual: bool = opt(False, "zero-init the last BN gamma of each residual block")


@dataclass
class TrainConfig:
    epochs: int = opt(12, "training epochs")
    batch_size: int = opt(64, "GLOBAL batch size (split evenly over ranks)")
    seed: int = opt(0, "seed for initialisation and the data plan (same on every rank)")
    threads: int = opt(1, "torch intra-op threads per rank")
    eval_every: int = opt(0, "evaluate every N epochs (0: only at the end)")
    max_steps: int = opt(0, "stop after this many optimiser steps (0: no limit)")


@dataclass
class OptimConfig:
    name: str = opt("sgd", "optimiser: sgd | lars")
    lr: float = opt(0.4, "base learning rate at base_batch (linear scaling rule applied if scale_lr)")
    base_batch: int = opt(256, "batch size at which lr is given")
    scale_lr: bool = opt(True, "linear scaling rule: lr * global_batch / base_batch")
    momentum: float = opt(0.9, "momentum")
    weight_decay: float = opt(1e-4, "weight decay (never on BN/bias when exclusion is on)")
    nesterov: bool = opt(False, "Nesterov momentum")
    schedule: str = opt("cosine", "decay after warmup: constant | step | cosine | poly")
    warmup: str = opt("linear", "warmup: none | linear | hybrid")
    warmup_epochs: float = opt(1.0, "warmup length in epochs")
    hybrid_hold_epochs: float = opt(-1.0, "hybrid warmup: epochs held at the peak after warmup (<0: = warmup_epochs)")
    poly_power: float = opt(2.0, "power of the polynomial decay")
    end_lr: float = opt(1e-4, "final learning rate of poly/cosine decay")
    step_epochs: list = opt([], "epochs at which step decay multiplies lr by step_gamma")
    step_gamma: float = opt(0.1, "step decay factor")
    label_smoothing: float = opt(0.0, "label smoothing of the cross-entropy loss")
    lars_eta: float = opt(0.001, "LARS trust coefficient eta")
    lars_eps: float = opt(1e-9, "LARS epsilon in the trust ratio denominator")
    lars_exclude_1d: bool = opt(True, "exclude 1-D parameters (BN, bias) from LARS and weight decay")
    lars_clip: bool = opt(False, "LARC-style clipping of the trust ratio")


@dataclass
class CommConfig:
    strategy: str = opt("flat", "gradient allreduce strategy (see README table)")
    compression: str = opt("none", "wire compression: none | fp16")
    ranks_per_node: int = opt(0, "emulate K ranks per node (0: real nodes via COMM_TYPE_SHARED)")
    bucket_mb: float = opt(25.0, "fusion bucket size in MB")
    overlap: bool = opt(False, "start bucket allreduces during backward")


@dataclass
class SyncConfig:
    algorithm: str = opt("ssgd", "update algorithm: ssgd (synchronous) | odsgd (one-step delay)")
    odsgd_warmup_steps: int = opt(200, "OD-SGD: plain SSGD for the first N steps")
    odsgd_local_lr: float = opt(0.0, "OD-SGD: lr of the local compensating update (0: the global lr)")
    odsgd_local_momentum: float = opt(0.0, "OD-SGD: momentum of the local optimiser (0: stateless W - lr*g)")
    odsgd_dc_lambda: float = opt(0.0, "OD-SGD: DC-ASGD delay-compensation strength (0: off)")
    comm_delay_ms: float = opt(0.0, "inject this latency into every gradient allreduce (testing)")


@dataclass
class PrecisionConfig:
    compute: str = opt("fp32", "compute precision: fp32 | bf16 | fp16 (autocast where supported)")
    loss_scale: str = opt("none", "loss scaling: none | dynamic | a fixed number")
    init_scale: float = opt(65536.0, "initial dynamic loss scale")
    growth_interval: int = opt(2000, "double the dynamic scale after this many clean steps")


@dataclass
class PolishConfig:
    bn_recompute: bool = opt(False, "Final Polishing: recompute BN statistics on un-augmented training data")
    bn_batches: int = opt(0, "batches per rank for the BN recompute (0: one full epoch)")
    unaugmented_epochs: int = opt(0, "Final Polishing: train the last N epochs without augmentation")


@dataclass
class CheckpointConfig:
    every_steps: int = opt(0, "write a checkpoint every N steps (0: only at the end / on signal)")
    keep: int = opt(3, "checkpoints kept")
    dir: str = opt("", "checkpoint directory (default RUN_DIR/checkpoints)")
    resume: str = opt("", "'auto' (newest valid checkpoint), a checkpoint path, or '' (fresh start)")


@dataclass
class RunConfig:
    run_dir: str = opt("runs/latest", "directory for metrics.jsonl, timeline and checkpoints")
    progress: bool = opt(True, "tqdm progress bar on rank 0")
    timeline: bool = opt(False, "write a Chrome-trace timeline of every rank's phases")
    watchdog_s: float = opt(0.0, "report ranks that have not reached a collective after N s (0: off)")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    polish: PolishConfig = field(default_factory=PolishConfig)
    ckpt: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def sections(cfg: Config):
    """Yield ``(section_name, section_dataclass_instance)``."""
    for f in dataclasses.fields(cfg):
        yield f.name, getattr(cfg, f.name)


def help_text(cfg: Config | None = None) -> str:
    """All keys with type, default and help, for ``--help``."""
    cfg = cfg or Config()
    lines = []
    for name, sec in sections(cfg):
        for f in dataclasses.fields(sec):
            default = getattr(sec, f.name)
            lines.append(f"  {name}.{f.name} = {default!r}\n      {f.metadata.get('help', '')}")
    return "\n".join(lines)


def _coerce(key: str, value, target_type):
    """Convert a TOML or string value to the field's type, or raise ConfigError naming the key."""
    tname = target_type if isinstance(target_type, str) else getattr(target_type, "__name__", str(target_type))
    tname = tname.split("[")[0]
    try:
        if tname == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if tname == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if tname == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tname == "list":
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip()]
                return [float(v) if "." in v else int(v) for v in value]
            return list(value)
        if tname == "str":
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError):
        raise ConfigError(f"config {key}: expected {tname}, got {value!r}") from None
    return value


def set_value(cfg: Config, dotted: str, value) -> None:
    """Set ``section.key`` on cfg from a TOML value or a CLI string."""
    section, _, key = dotted.partition(".")
    sec = getattr(cfg, section, None) if section in {n for n, _ in sections(cfg)} else None
    if sec is None or not key:
        raise ConfigError(f"config {dotted}: unknown key (sections: {', '.join(n for n, _ in sections(cfg))})")
    hints = typing.get_type_hints(type(sec))
    if key not in hints:
        raise ConfigError(f"config {dotted}: unknown key")
    setattr(sec, key, _coerce(dotted, value, hints[key]))


def load_toml(cfg: Config, path: str) -> None:
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    for section, table in doc.items():
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: top-level key {section!r} must be a [section]")
        for key, value in table.items():
            set_value(cfg, f"{section}.{key}", value)


def validate(cfg: Config, world_size: int = 1) -> None:
    """Check values that would otherwise fail later, on some ranks, with a traceback."""
    t, o, c, d, p = cfg.train, cfg.optim, cfg.comm, cfg.data, cfg.precision
    checks = [
        (o.name in ("sgd", "lars"), "optim.name", f"must be sgd or lars, got {o.name!r}"),
        (o.schedule in ("constant", "step", "cosine", "poly"), "optim.schedule",
         f"must be constant, step, cosine or poly, got {o.schedule!r}"),
        (o.warmup in ("none", "linear", "hybrid"), "optim.warmup", f"must be none, linear or hybrid, got {o.warmup!r}"),
        (c.compression in ("none", "fp16"), "comm.compression", f"must be none or fp16, got {c.compression!r}"),
        (cfg.sync.algorithm in ("ssgd", "odsgd"), "sync.algorithm", f"must be ssgd or odsgd, got {cfg.sync.algorithm!r}"),
        (cfg.sync.odsgd_warmup_steps >= 0, "sync.odsgd_warmup_steps", f"must be >= 0, got {cfg.sync.odsgd_warmup_steps}"),
        (cfg.sync.odsgd_local_lr >= 0, "sync.odsgd_local_lr", f"must be >= 0, got {cfg.sync.odsgd_local_lr}"),
        (0 <= cfg.sync.odsgd_local_momentum < 1, "sync.odsgd_local_momentum",
         f"must be in [0, 1), got {cfg.sync.odsgd_local_momentum}"),
        (cfg.sync.odsgd_dc_lambda >= 0, "sync.odsgd_dc_lambda", f"must be >= 0, got {cfg.sync.odsgd_dc_lambda}"),
        (cfg.sync.comm_delay_ms >= 0, "sync.comm_delay_ms", f"must be >= 0, got {cfg.sync.comm_delay_ms}"),
        (p.compute in ("fp32", "bf16", "fp16"), "precision.compute", f"must be fp32, bf16 or fp16, got {p.compute!r}"),
        (p.loss_scale in ("none", "dynamic") or _is_number(p.loss_scale), "precision.loss_scale",
         f"must be none, dynamic or a number, got {p.loss_scale!r}"),
        (cfg.ckpt.every_steps >= 0, "ckpt.every_steps", f"must be >= 0, got {cfg.ckpt.every_steps}"),
        (cfg.ckpt.keep >= 1, "ckpt.keep", f"must be >= 1, got {cfg.ckpt.keep}"),
        (t.batch_size > 0, "train.batch_size", f"must be positive, got {t.batch_size}"),
        (t.batch_size % world_size == 0, "train.batch_size",
         f"global batch {t.batch_size} is not divisible by {world_size} ranks"),
        (t.epochs > 0, "train.epochs", f"must be positive, got {t.epochs}"),
        (t.threads > 0, "train.threads", f"must be positive, got {t.threads}"),
        (t.max_steps >= 0, "train.max_steps", f"must be >= 0, got {t.max_steps}"),
        (o.lr > 0, "optim.lr", f"must be positive, got {o.lr}"),
        (o.base_batch > 0, "optim.base_batch", f"must be positive, got {o.base_batch}"),
        (0 <= o.momentum < 1, "optim.momentum", f"must be in [0, 1), got {o.momentum}"),
        (o.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {o.weight_decay}"),
        (o.warmup_epochs >= 0, "optim.warmup_epochs", f"must be >= 0, got {o.warmup_epochs}"),
        (0 <= o.label_smoothing < 1, "optim.label_smoothing", f"must be in [0, 1), got {o.label_smoothing}"),
        (c.ranks_per_node >= 0, "comm.ranks_per_node", f"must be >= 0, got {c.ranks_per_node}"),
        (c.bucket_mb > 0, "comm.bucket_mb", f"must be positive, got {c.bucket_mb}"),
        (d.block_size > 0, "data.block_size", f"must be positive, got {d.block_size}"),
        (d.prefetch >= 0, "data.prefetch", f"must be >= 0, got {d.prefetch}"),
        (d.shuffle_window >= 0, "data.shuffle_window", f"must be >= 0, got {d.shuffle_window}"),
    ]
    for ok, key, msg in checks:
        if not ok:
            raise ConfigError(f"config {key}: {msg}")


def _is_number(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False
