"""Set-up of a run from its config: topology, device, data, model, optimiser, trainer.

The one place where a :class:`~hpctrain.job.config.Config` is read into the plain keywords the
library takes (:func:`trainer_keywords`, the loader's and the checkpointer's): below the job,
no module sees the Config. Each local phase is agreed on by every rank before the next
collective (:func:`_agreed`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from mpi4py import MPI

from hpctrain import kernels
from hpctrain.job import gpu_settings
from hpctrain.api import bind_device
from hpctrain.comm.threads import overlap_unsupported
from hpctrain.config.plugins import plugin_options
from hpctrain.config.values import matching_options
from hpctrain.data import ShardLoader, ShardSet, eval_batches, open_split, read_index, train_loader
from hpctrain.data_tools.builtin import resolve_dataset
from hpctrain.errors import ConfigError, UserError, config_errors
from hpctrain.job.config import Config
from hpctrain.models import BUILTIN, ModelError, build_model, check_model_output
from hpctrain.models.compiled import compile_model

from hpctrain.models.ghostbn import use_bn_groups
from hpctrain.ops.agree import agree, check_consistency, software_versions
from hpctrain.ops.checkpoint import Checkpointer
from hpctrain.ops.metrics import StepTimer, Timer, clock_for
from hpctrain.optim import make_criterion, make_optimizer
from hpctrain.optim.loss_scale import LossScaler
from hpctrain.optim.recipe import apply_recipe
from hpctrain.optim.schedules import ScheduleSpec, describe_lr, spec_from_config
from hpctrain.ops.testhooks import device_batches_forced
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer, compute_unsupported


@dataclass
class Job:
    """Everything set up for a run (what :func:`setup` returns)."""
    cfg: Config
    topo: Topology
    trainer: DistributedTrainer
    loader: ShardLoader
    test_set: ShardSet
    timer: StepTimer
    device: torch.device = torch.device("cpu")
    raw: bool = False          # batches cross as stored and are normalised on the device (raw_batches)
    lr_line: str = ""          # the start-up line's lr and why (optim.recipe = "auto": the recipe's line)

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model


def on_agreed_exit(close: Callable[[], object]) -> Callable[..., bool]:
    """An ``ExitStack`` exit callback running the collective ``close`` on a normal exit or an
    error every rank raised together (an ``agreed`` :class:`UserError`: set-up errors, stops,
    checkpoint errors, non-finite steps). Any other exception may be this rank's alone: a
    collective would then hang, so it is skipped and the abort hook ends the job."""
    def exit_(exc_type, exc, tb):
        if exc_type is None or (issubclass(exc_type, UserError) and exc_type.agreed):
            close()
        return False
    return exit_


def setup(cfg: Config, comm: MPI.Comm, stack: contextlib.ExitStack, done=None) -> Job:
    """Build every part of a run. Collective.

    Each local set-up phase is followed by :func:`agree`, so a user error on any rank stops
    every rank with one line before the next collective; the collective parts come after.
    Every part is registered on ``stack`` as soon as it exists, so it is released on every exit.
    ``done(name, 0, 0)`` after each phase (the watchdog's sink: a rank stuck in set-up is named).
    """
    done = done or (lambda name, start_s, duration_s: None)
    torch.set_num_threads(cfg.train.threads)
    topo = Topology.create(comm, cfg.comm.ranks_per_node)
    stack.push(on_agreed_exit(topo.close))
    done("topology", 0.0, 0.0)
    device = _agreed(comm, bind_device, topo, cfg.train.device)
    gpu_settings.apply(cudnn_benchmark=cfg.train.cudnn_benchmark, tf32=cfg.train.tf32)
    if device.type == "cuda":   # CuPy's NVRTC tried once now, not at the first kernel mid-run
        kernels.backend()
    raw = raw_batches(device)
    index = _agreed(comm, _data_index, cfg, topo)
    done("data index", 0.0, 0.0)
    loader, test_set = _agreed(comm, _open_data, cfg, topo, index, stack, raw)
    done("open data", 0.0, 0.0)
    model, optimizer, schedule, optim, recipe_line = _agreed(comm, _model_and_optimizer, cfg, index, loader, device)
    cfg = dataclasses.replace(cfg, optim=optim)          # as run (the recipe's values): checked and recorded
    done("build model", 0.0, 0.0)
    # collective, same verdict on every rank: names an odd rank out
    _agreed(comm, check_consistency, topo.comm, model, cfg.to_dict(), software(device))
    done("start-up check", 0.0, 0.0)
    timer = StepTimer(clock=clock_for(device))     # CUDA events on a GPU (what the device spends)
    trainer = DistributedTrainer(model, optimizer, topo, **trainer_keywords(cfg), schedule=schedule, timer=timer)
    stack.push(on_agreed_exit(trainer.close))
    if cfg.model.compile:     # after the broadcast, in place: hooks and state_dict keys stay the model's
        _agreed(comm, compile_model, model, cfg.model.compile_mode, device.type)
    return Job(cfg, topo, trainer, loader, test_set, timer, device, raw,
               recipe_line or describe_lr(cfg.optim, loader.global_batch))


def trainer_keywords(cfg: Config) -> dict:
    """:class:`DistributedTrainer`'s keywords from the ``[comm]``, ``[update]`` and ``[precision]``
    sections and ``optim.label_smoothing`` (with a schedule and a timer of the caller's: a script
    holding a Config builds its trainer as the job does, ``DistributedTrainer(model, opt, topo,
    **trainer_keywords(cfg), schedule=...)``)."""
    c, u = cfg.comm, cfg.update
    return dict(strategy=c.strategy, compression=c.compression, bucket_mb=c.bucket_mb, overlap=c.overlap,
                tune=c.tune, comm_delay_ms=c.delay_ms, compression_options=plugin_options(c, c.compression),
                algorithm=u.algorithm, algorithm_options=plugin_options(u, u.algorithm),
                loss_fn=make_criterion(cfg.optim.label_smoothing), compute=cfg.precision.compute,
                scaler=loss_scaler(cfg.precision))


def loss_scaler(p) -> LossScaler | None:
    """The scaler of a ``[precision]`` section: ``loss_scale`` none (no scaler), dynamic, or a
    fixed number (never grows, never backs off below itself)."""
    if p.loss_scale == "none":
        return None
    if p.loss_scale == "dynamic":
        return LossScaler(init_scale=p.init_scale, growth_interval=p.growth_interval)
    value = float(p.loss_scale)
    return LossScaler(init_scale=value, growth_interval=2**62, min_scale=value, max_scale=value)


def build_optimizer(params_or_model, o) -> torch.optim.Optimizer:
    """:func:`~hpctrain.optim.make_optimizer` from an ``[optim]`` section: its shared fields named
    as the keywords, the chosen optimiser's own options from its sub-table ``[optim.<name>]`` over
    the factory's defaults; a value it refuses is a ConfigError."""
    with config_errors():
        return make_optimizer(params_or_model, **matching_options(make_optimizer, o), **plugin_options(o, o.name))


def build_schedule(o, *, global_batch: int, steps_per_epoch: int, epochs: int) -> ScheduleSpec:
    """:func:`~hpctrain.optim.spec_from_config` from an ``[optim]`` section and the run's shape;
    a value it refuses (warm-up longer than the run) is a ConfigError."""
    with config_errors():
        return spec_from_config(**matching_options(
            spec_from_config, o, global_batch=global_batch, steps_per_epoch=steps_per_epoch, epochs=epochs,
            kind=o.schedule, optimizer=o.name,
            hold_epochs=None if o.hybrid_hold_epochs < 0 else o.hybrid_hold_epochs))


def loader_keywords(cfg: Config, ranks: int, raw: bool = False) -> dict:
    """:func:`~hpctrain.data.train_loader`'s keywords: each ``[data]`` field named as one of them
    (a new data option is its field and its keyword, no line here), this rank's share of the
    global batch, the seed."""
    return matching_options(train_loader, cfg.data, raw=raw, seed=cfg.train.seed,
                            batch_size=cfg.train.batch_size // ranks)


def checkpointer(cfg: Config, comm: MPI.Comm, loader: ShardLoader, timer: Timer, run_id: str | None) -> Checkpointer:
    """The run's :class:`Checkpointer` from ``[ckpt]`` and ``run.run_dir`` (``RUN_DIR/checkpoints``
    unless ``ckpt.dir`` names one); the config it records is the whole run's."""
    directory = cfg.ckpt.dir or os.path.join(cfg.run.run_dir, "checkpoints")
    return Checkpointer(comm, directory, steps_per_epoch=loader.steps, global_batch=loader.global_batch,
                        config=cfg.to_dict(), every_steps=cfg.ckpt.every_steps, keep=cfg.ckpt.keep, timer=timer,
                        run_id=run_id, lanes=loader.lanes)


def raw_batches(device: torch.device) -> bool:
    """Whether the loader hands over raw batches that the job normalises (and augments) on
    ``device`` after the copy: on a GPU, so a uint8 batch crosses PCIe at a quarter of float32's
    bytes and the GPU does the arithmetic; on the CPU only when the tests ask (:mod:`hpctrain.ops.testhooks`)
    (the same batches either way; the loader's thread does it, overlapped with the step)."""
    return device.type != "cpu" or device_batches_forced()


def software(device: torch.device) -> dict:
    """The versions every rank must share; on a GPU also the kernel path (CuPy's kernels on one
    rank and torch's reference on another would round differently: the start-up check names it)."""
    versions = software_versions()
    if device.type == "cuda":
        versions["kernels"] = kernels.backend()[0]
    return versions


def _agreed(comm: MPI.Comm, phase, *args):
    """Run a set-up phase; if it fails on any rank with a :class:`UserError`, every rank raises
    the same one. Any other exception is a bug: it keeps its traceback and aborts the job."""
    error, result = None, None
    try:
        result = phase(*args)
    except UserError as exc:
        error = exc
    agree(comm, error)
    return result


def _data_index(cfg: Config, topo: Topology):
    return read_index(resolve_dataset(cfg.data.dataset, cfg.data.cache_dir, topo.comm))


def _open_data(cfg: Config, topo: Topology, index, stack: contextlib.ExitStack, raw: bool = False):
    """Train loader and test split (collective opens with ``mpio``), registered on ``stack``
    at once: a check failing on one rank after the opens still closes them on every rank."""
    loader = train_loader(index, topo, **loader_keywords(cfg, topo.size, raw))
    stack.push(on_agreed_exit(loader.close))
    test_set = open_split(index, "test", topo, driver=cfg.data.hdf5_driver, verify=cfg.data.verify)
    stack.push(on_agreed_exit(test_set.close))
    test_set.check()
    if loader.steps == 0:
        raise ConfigError(f"config train.batch_size: global batch {cfg.train.batch_size} is larger than "
                          f"the {loader.shards.num_samples} training samples")
    return loader, test_set


def _model_and_optimizer(cfg: Config, index, loader, device: torch.device):
    """Local only (no collectives): model (on ``device``, before the optimiser sees its
    parameters), output check, optimiser, schedule."""
    why = compute_unsupported(cfg.precision.compute, device)
    if why:
        raise ConfigError(f"config precision.compute: {why}")
    why = overlap_unsupported(cfg.comm.overlap, device)
    if why:
        raise ConfigError(f"config {why}")
    torch.manual_seed(cfg.train.seed)
    m = cfg.model
    try:
        model = build_model(m.name, num_classes=index.num_classes, in_channels=index.sample_shape[0],
                            batchnorm=m.batchnorm, zero_init_residual=m.zero_init_residual)
        if m.bn_group:
            use_bn_groups(model, m.bn_group)
    except (ValueError, OSError, RuntimeError, ImportError) as exc:
        if isinstance(exc, UserError) or m.name in BUILTIN:
            raise                                  # a built-in model's failure is hpctrain's bug
        raise ModelError(str(exc)) from exc        # the user's own factory failed: one line
    if device.type != "cpu":                    # built on the CPU; moved before the optimiser sees it
        model = model.to(device)
    model = gpu_settings.model_memory_format(model, cfg.train.channels_last)
    sample = next(iter(eval_batches(loader.shards, rank=0, size=1, batch_size=2)))[0].to(device)
    check_model_output(model, sample, index.num_classes, m.name)
    optim, recipe_line = apply_recipe(cfg.optim, cfg.train.batch_size, model, cfg.train.epochs)  # recipe "auto"
    optimizer = build_optimizer(model, optim)
    schedule = build_schedule(optim, global_batch=cfg.train.batch_size, steps_per_epoch=loader.steps,
                                    epochs=cfg.train.epochs)
    return model, optimizer, schedule, optim, recipe_line
