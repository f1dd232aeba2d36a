"""Run configuration: nested dataclasses, an optional TOML file, and ``--set key=value`` overrides.

Precedence: dataclass defaults < TOML file (``--config``) < ``--set section.key=value`` < named
flags (``--epochs``…). Every field carries a one-line help text (``help_text``); ``--help`` lists
them all. Bad values raise :class:`ConfigError` whose message names the field — the entry point
prints it as one line on rank 0 and every rank exits with status 2.

Numbers: every int and float field carries a :class:`Range` (shown by ``--help``); NaN and ±inf
are refused for every float field when the value is read (``_coerce``), the range by
:func:`validate`. Choice fields name their registry (``choices="hpctrain.comm:STRATEGIES"``), which
:func:`validate` imports, so a strategy, compression, schedule… added there is accepted here
without re-typing the list (the registries pull in torch and MPI, hence the lazy import). A
value ``package.module:name`` selects a plugin outside the tree (:mod:`hpctrain.registry`).
"""
from __future__ import annotations

import dataclasses
import importlib
import math
import os
import tomllib
import typing
from dataclasses import dataclass, field

from hpctrain.errors import ConfigError

INF = math.inf


@dataclass(frozen=True)
class Range:
    """The values a numeric field accepts: ``lo``..``hi``, each end closed unless marked open."""
    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, x) -> bool:
        above = x > self.lo if self.lo_open else x >= self.lo
        below = x < self.hi if self.hi_open else x <= self.hi
        return above and below

    def describe(self) -> str:
        """``positive``, ``>= 0`` or ``in [lo, hi)`` (what follows "must be" in an error)."""
        if self.hi == INF and self.lo == 0:
            return "positive" if self.lo_open else ">= 0"
        if self.hi == INF:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


POSITIVE, NON_NEGATIVE, FRACTION = Range(0, INF, lo_open=True), Range(0, INF), Range(0, 1, hi_open=True)
LR = Range(0, 1e3, lo_open=True)
# = LossScaler's default min_scale / max_scale (tests/unit/test_config.py checks they agree): a
# scale of at most 2**24 keeps loss * scale and the scaled gradients finite in fp32, and fp16
# overflows back off from there.
LOSS_SCALE = Range(1.0, 2.0 ** 24)


def opt(default, help: str, *, range: Range | None = None, choices=None, **kw):
    """A dataclass field with a help text for ``--help``; numeric fields give their ``range``,
    choice fields their ``choices`` (a tuple, or ``"module:NAME"`` of the registry to check)."""
    meta = {"help": help, "range": range, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass
class DataConfig:
    dataset: str = opt("digits", "'digits' (bundled scikit-learn digits), 'signal1d' or 'tabular' (generated, "
                       "data_tools/synthetic.py), converted on first use, or a shard directory")
    cache_dir: str = opt("~/.cache/hpctrain", "where built-in datasets are converted to shards")
    block_size: int = opt(32, "samples per contiguous block in the per-epoch shuffle plan", range=POSITIVE)
    shuffle_window: int = opt(1024, "samples shuffled together in memory after contiguous reads",
                              range=NON_NEGATIVE)
    prefetch: int = opt(2, "batches prepared ahead by the background reader", range=NON_NEGATIVE)
    augment: bool = opt(False, "train-time augmentation (pad-crop, flip)")
    drop_last: bool = opt(True, "drop the last partial global batch of an epoch")
    augment_kind: str = opt("auto", "augmentation: auto (padcrop up to 64 px, rrc above) | padcrop | rrc | flip",
                            choices="hpctrain.data.augment:KINDS")
    augment_flip: bool = opt(True, "random horizontal flips in the augmentation (off for digits, text)")
    reader: str = opt("rank", "rank: each rank reads its batches | node: one reader per node fills an MPI-3 "
                              "shared-memory window", choices="hpctrain.data.factory:READERS")
    hdf5_driver: str = opt("auto", "auto (parallel HDF5 'mpio' when h5py has MPI) | mpio | serial (per-shard "
                                   "files, pread of contiguous datasets)", choices="hpctrain.data.hdf5:DRIVERS")
    verify: str = opt("shared", "checksums against index.json: index v3/v4 block digests, metadata blocks at "
                                "open and each data block as it is first read; v1/v2 whole files at open: shared (each "
                                "shard by one rank, once per job) | node (each node checks its own copy) | off",
                      choices="hpctrain.data.shards:VERIFY_MODES")


@dataclass
class ModelConfig:
    name: str = opt("digits_cnn", "built-in model name or 'package.module:factory'")
    batchnorm: bool = opt(True, "use BatchNorm in the built-in small models")
    zero_init_residual: bool = opt(False, "zero-init the last BN gamma of each residual block")


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
                      choices="hpctrain.api:DEVICES")
    cudnn_benchmark: bool = opt(True, "GPU: cuDNN picks the fastest convolution algorithms per input shape "
                                      "(not bitwise reproducible run to run)")
    tf32: bool = opt(False, "GPU: fp32 matmuls in TensorFloat-32 on Ampere and newer (faster, 10-bit mantissa)")
    channels_last: bool = opt(False, "the model in channels-last (NHWC) memory layout (GPU tensor cores)")


@dataclass
class OptimConfig:
    name: str = opt("sgd", "optimiser: sgd | lars | lamb", choices="hpctrain.optim:OPTIMIZERS")
    recipe: str = opt("none", "none: lr, lars_eta, warm-up and schedule as given | auto: the large-batch table "
                      "(docs/large-batch.md) sets them from the global batch, the optimiser and whether the model "
                      "normalises (lars, lamb)", choices="hpctrain.optim.recipe:RECIPES")
    lr: float = opt(0.4, "base learning rate at base_batch (linear scaling rule applied if scale_lr)", range=LR)
    base_batch: int = opt(256, "batch size at which lr is given", range=POSITIVE)
    scale_lr: bool = opt(True, "linear scaling rule: lr * global_batch / base_batch")
    momentum: float = opt(0.9, "momentum", range=FRACTION)
    weight_decay: float = opt(1e-4, "weight decay (never on BN/bias when exclusion is on)", range=Range(0, 1))
    nesterov: bool = opt(False, "Nesterov momentum")
    schedule: str = opt("cosine", "decay after warmup: constant | step | cosine | poly",
                        choices="hpctrain.optim.schedules:KINDS")
    warmup: str = opt("linear", "warmup: none | linear | hybrid", choices="hpctrain.optim.schedules:WARMUPS")
    warmup_epochs: float = opt(1.0, "warmup length in epochs", range=Range(0, 1e5))
    hybrid_hold_epochs: float = opt(-1.0, "hybrid warmup: epochs held at the peak after warmup (<0: = warmup_epochs)",
                                    range=Range(-1, 1e5))
    poly_power: float = opt(2.0, "power of the polynomial decay", range=Range(0, 100, lo_open=True))
    end_lr: float = opt(1e-4, "final learning rate of poly/cosine decay", range=Range(0, 1e3))
    step_epochs: list = opt([], "epochs at which step decay multiplies lr by step_gamma", range=Range(0, 1e5))
    step_gamma: float = opt(0.1, "step decay factor", range=Range(0, 1, lo_open=True))
    label_smoothing: float = opt(0.0, "label smoothing of the cross-entropy loss", range=FRACTION)
    lars_eta: float = opt(0.001, "LARS trust coefficient eta", range=Range(0, 1, lo_open=True))
    lars_eps: float = opt(1e-9, "LARS epsilon in the trust ratio denominator", range=Range(0, 1))
    lars_exclude_1d: bool = opt(True, "exclude 1-D parameters (BN, bias) from the trust ratio (LARS, LAMB) and "
                                "weight decay")
    lars_clip: bool = opt(False, "LARC-style clipping of the trust ratio")
    lr_1d_scale: float = opt(1.0, "LARS/LAMB: lr multiplier of the 1-D parameters excluded from the trust ratio "
                             "(1: the raw lr, as MLPerf; too large for a BN-free net, docs/large-batch.md)",
                             range=Range(0, 1))
    lamb_beta2: float = opt(0.999, "LAMB: second-moment decay (beta1 is optim.momentum)", range=FRACTION)
    lamb_eps: float = opt(1e-6, "LAMB: epsilon added to sqrt(v_hat)", range=Range(0, 1))


@dataclass
class CommConfig:
    strategy: str = opt("auto", "gradient allreduce strategy: auto (hierarchical where a node holds several ranks, "
                        "else flat) | flat | hierarchical (README table)", choices="hpctrain.comm:STRATEGIES")
    compression: str = opt("none", "wire compression: none | fp16", choices="hpctrain.comm:COMPRESSIONS")
    ranks_per_node: int = opt(0, "emulate K ranks per node (0: real nodes via COMM_TYPE_SHARED)", range=NON_NEGATIVE)
    bucket_mb: float = opt(25.0, "fusion bucket size in MB", range=Range(0, 65536, lo_open=True))
    overlap: bool = opt(False, "start bucket allreduces during backward (off: measured faster on CPU "
                        "hosts, README)")
    tune: str = opt("measure", "per bucket, MPI's allreduce or the ring: measure (time both at start-up) "
                    "| static (a fixed size rule)", choices="hpctrain.comm.tuner:TUNES")


@dataclass
class SyncConfig:
    algorithm: str = opt("ssgd", "update algorithm: ssgd (synchronous) | odsgd (one-step delay)",
                         choices="hpctrain.sync:ALGORITHMS")
    odsgd_warmup_steps: int = opt(200, "OD-SGD: plain SSGD for the first N steps", range=NON_NEGATIVE)
    odsgd_local_lr: float = opt(0.0, "OD-SGD: lr of the local compensating update (0: the global lr)",
                                range=Range(0, 1e3))
    odsgd_local_momentum: float = opt(0.0, "OD-SGD: momentum of the local optimiser (0: stateless W - lr*g)",
                                      range=FRACTION)
    odsgd_dc_lambda: float = opt(0.0, "OD-SGD: DC-ASGD delay-compensation strength (0: off)", range=Range(0, 1e3))
    comm_delay_ms: float = opt(0.0, "inject this latency into every gradient allreduce (testing)",
                               range=Range(0, 60000))


@dataclass
class PrecisionConfig:
    compute: str = opt("fp32", "compute precision: fp32 | bf16 | fp16 (autocast where supported)",
                       choices="hpctrain.trainer:AUTOCAST_DTYPES")
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
    """All keys with type, default, help and range, for ``--help``."""
    cfg = cfg or Config()
    lines = []
    for name, sec in sections(cfg):
        for f in dataclasses.fields(sec):
            default = getattr(sec, f.name)
            rng = f.metadata.get("range")
            extra = f" (must be {rng.describe()})" if rng is not None else ""
            lines.append(f"  {name}.{f.name} = {default!r}\n      {f.metadata.get('help', '')}{extra}")
    return "\n".join(lines)


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise ValueError
    return x


def _number(v):
    """A list element: an int or a finite float (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError
    return v if isinstance(v, int) else _finite(v)


def _coerce(key: str, value, target_type):
    """Convert a TOML or string value to the field's type, or raise ConfigError naming the key.

    Floats must be finite: NaN and ±inf (``inf``, ``nan``, ``1e400``) are refused here, for every
    float field, before any range check.
    """
    tname = target_type if isinstance(target_type, str) else getattr(target_type, "__name__", str(target_type))
    tname = tname.split("[")[0]
    given = value
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
            return _finite(float(value))
        if tname == "list":
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip()]
                value = [float(v) if "." in v else int(v) for v in value]
            return [_number(v) for v in value]
        if tname == "str":
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError, OverflowError):
        want = {"float": "a finite float", "list": "a list of finite numbers"}.get(tname, tname)
        raise ConfigError(f"config {key}: expected {want}, got {given!r}") from None
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
            set_value(cfg, f"{section}.{key}", value)


def registry(choices) -> tuple:
    """The accepted names of a choice field: the tuple itself, or the keys of ``"module:NAME"``."""
    if isinstance(choices, str):
        module, _, name = choices.partition(":")
        choices = getattr(importlib.import_module(module), name)
    return tuple(choices)


def _plugin_problem(choices: str, value: str) -> str | None:
    """``package.module:name`` for a registry field (:mod:`hpctrain.registry`): None once the
    module imports and registers ``name``, else why not."""
    module, _, name = choices.partition(":")
    reg = getattr(importlib.import_module(module), name)
    if not hasattr(reg, "plugin_problem"):
        return f"must be one of {' | '.join(registry(choices))}, got {value!r}"
    return reg.plugin_problem(value)


def field_problem(f: dataclasses.Field, value) -> str | None:
    """What is wrong with ``value`` for field ``f`` (its range or choices), or None.

    A range refuses NaN and ±inf by itself (every comparison with NaN is false; every float range
    has finite ends), so a non-finite value set in code, past ``_coerce``, is caught here too.
    """
    rng, choices = f.metadata.get("range"), f.metadata.get("choices")
    if f.name == "loss_scale":                 # precision.loss_scale: a word or a number
        if value in ("none", "dynamic"):
            return None
        assert rng is not None      # its field has range=LOSS_SCALE
        try:
            ok = float(value) in rng
        except ValueError:
            ok = False
        return None if ok else f"must be none, dynamic or a number {rng.describe()}, got {value!r}"
    if choices is not None:
        allowed = registry(choices)
        if isinstance(value, str) and ":" in value and isinstance(choices, str):
            return _plugin_problem(choices, value)
        return None if value in allowed else f"must be one of {' | '.join(allowed)}, got {value!r}"
    if rng is None:
        return None
    for x in value if isinstance(value, list) else [value]:
        if x not in rng:
            return f"must be {rng.describe()}, got {x!r}"
    return None


def check_field(section: str, key: str, value) -> None:
    """Check one value against field ``section.key``'s range or choices, as :func:`validate`
    does: for a constructor given the value in code (the library API), so the rule is written
    once, here."""
    f = next(f for f in dataclasses.fields(getattr(Config(), section)) if f.name == key)
    problem = field_problem(f, value)
    if problem:
        raise ConfigError(f"config {section}.{key}: {problem}")


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


def validate(cfg: Config, world_size: int = 1) -> None:
    """Check values that would otherwise fail later, on some ranks, with a traceback (or train on
    NaN): every field's range or choices, then what depends on several fields or the file system."""
    for name, sec in sections(cfg):
        for f in dataclasses.fields(sec):
            problem = field_problem(f, getattr(sec, f.name))
            if problem:
                raise ConfigError(f"config {name}.{f.name}: {problem}")
    checks = [
        (cfg.train.batch_size % world_size == 0, "train.batch_size",
         f"global batch {cfg.train.batch_size} is not divisible by {world_size} ranks"),
        (not dir_problem(cfg.run.run_dir), "run.run_dir", dir_problem(cfg.run.run_dir)),
        (not cfg.ckpt.dir or not dir_problem(cfg.ckpt.dir), "ckpt.dir", cfg.ckpt.dir and dir_problem(cfg.ckpt.dir)),
    ]
    for ok, key, msg in checks:
        if not ok:
            raise ConfigError(f"config {key}: {msg}")
