"""The training loop: the one place that wires topology, data, model, sync and optimiser together.

Synchronous data-parallel SGD: every rank computes gradients on its share of the global batch,
the gradient-sync strategy replaces them by their mean over ranks, and every rank applies the
same optimiser step, so parameters stay identical (initial ones are broadcast from rank 0).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from mpi4py import MPI
from torch import nn

from hpctrain import comm as comm_lib
from hpctrain.config import Config, ConfigError
from hpctrain.data import ShardError, ShardLoader, ShardSet, eval_batches, read_index
from hpctrain.data.builtin import resolve_dataset
from hpctrain.faults import agree, maybe_inject
from hpctrain.metrics import MetricsLog, gpu_time
from hpctrain.models import build_model
from hpctrain.optim import make_optimizer, set_lr
from hpctrain.optim.schedules import lr_at, spec_from_config
from hpctrain.topology import Topology


@dataclass
class Job:
    """Everything set up for a run (what :func:`setup` returns)."""
    cfg: Config
    topo: Topology
    model: nn.Module
    optimizer: torch.optim.Optimizer
    sync: comm_lib.GradSync
    loader: ShardLoader
    test_set: ShardSet
    schedule: object
    loss_fn: nn.Module


def setup(cfg: Config, comm: MPI.Comm) -> Job:
    """Build every part of a run. Collective; a user error on any rank stops all with one line."""
    torch.set_num_threads(cfg.train.threads)
    topo = Topology.create(comm, cfg.comm.ranks_per_node)
    error, job = None, None
    try:
        job = _build(cfg, topo)
    except (ConfigError, ShardError, ValueError, OSError, RuntimeError, ImportError) as exc:
        error = exc
    agree(comm, error)
    return job


def _build(cfg: Config, topo: Topology) -> Job:
    data_dir = resolve_dataset(cfg.data.dataset, cfg.data.cache_dir, topo.comm)
    index = read_index(data_dir)
    train_set, test_set = ShardSet(index, "train"), ShardSet(index, "test")
    train_set.check()
    test_set.check()
    per_rank = cfg.train.batch_size // topo.size
    loader = ShardLoader(train_set, rank=topo.rank, size=topo.size, batch_size=per_rank,
                         seed=cfg.train.seed, block_size=cfg.data.block_size,
                         shuffle_window=cfg.data.shuffle_window, prefetch=cfg.data.prefetch,
                         drop_last=cfg.data.drop_last)
    if loader.steps == 0:
        raise ConfigError(f"config train.batch_size: global batch {cfg.train.batch_size} is larger than "
                          f"the {train_set.num_samples} training samples")
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model.name, num_classes=index.num_classes, in_channels=index.sample_shape[0],
                        batchnorm=cfg.model.batchnorm, zero_init_residual=cfg.model.zero_init_residual)
    comm_lib.broadcast_module(model, topo.comm)
    o = cfg.optim
    optimizer = make_optimizer(model, o.name, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay,
                               nesterov=o.nesterov, eta=o.lars_eta, eps=o.lars_eps,
                               exclude_1d=o.lars_exclude_1d, clip=o.lars_clip)
    sync = comm_lib.create(cfg.comm.strategy, model.parameters(), topo,
                           bucket_bytes=int(cfg.comm.bucket_mb * 2**20))
    schedule = spec_from_config(lr=o.lr, global_batch=cfg.train.batch_size, steps_per_epoch=loader.steps,
                                epochs=cfg.train.epochs, warmup_epochs=o.warmup_epochs, kind=o.schedule,
                                warmup=o.warmup, optimizer=o.name, base_batch=o.base_batch,
                                scale_lr=o.scale_lr, poly_power=o.poly_power, end_lr=o.end_lr,
                                step_epochs=o.step_epochs, step_gamma=o.step_gamma)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=o.label_smoothing)
    return Job(cfg, topo, model, optimizer, sync, loader, test_set, schedule, loss_fn)


def evaluate(job: Job, batch_size: int = 256) -> dict:
    """Exact accuracy and mean loss over the whole test split (each rank scores its share)."""
    model, topo = job.model, job.topo
    model.eval()
    correct = loss_sum = count = 0.0
    with torch.no_grad():
        for x, y in eval_batches(job.test_set, rank=topo.rank, size=topo.size, batch_size=batch_size):
            out = model(x)
            loss_sum += float(nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += float((out.argmax(1) == y).sum())
            count += len(y)
    model.train()
    correct, loss_sum, count = comm_lib.allreduce_sum([correct, loss_sum, count], topo.comm)
    return {"test_accuracy": correct / count, "test_loss": loss_sum / count, "test_samples": int(count)}


def train_step(job: Job, x: torch.Tensor, y: torch.Tensor, lr: float) -> torch.Tensor:
    """One synchronous step: forward, backward, gradient mean over ranks, optimiser update."""
    set_lr(job.optimizer, lr)
    job.optimizer.zero_grad(set_to_none=False)
    loss = job.loss_fn(job.model(x), y)
    loss.backward()
    job.sync.allreduce_grads()
    job.optimizer.step()
    return loss.detach()


def run(cfg: Config, comm: MPI.Comm) -> dict:
    """Train and evaluate; returns the summary (identical on every rank)."""
    t0 = time.perf_counter()
    job = setup(cfg, comm)
    topo, loader = job.topo, job.loader
    is_root = topo.rank == 0
    log = MetricsLog(cfg.run.run_dir, enabled=is_root)
    log.log("config", config=cfg.to_dict(), world_size=topo.size, topology=topo.describe(),
            steps_per_epoch=loader.steps)
    total_steps = loader.steps * cfg.train.epochs
    if cfg.train.max_steps:
        total_steps = min(total_steps, cfg.train.max_steps)
    bar = None
    if is_root and cfg.run.progress:
        from tqdm import tqdm
        bar = tqdm(total=total_steps, desc=f"train x{topo.size}", unit="step", dynamic_ncols=True)
    step, samples, t_train = 0, 0, time.perf_counter()
    for epoch in range(cfg.train.epochs):
        t_epoch, loss_sum, n = time.perf_counter(), torch.zeros(()), 0
        for x, y in loader.epoch(epoch):
            if step >= total_steps:
                break
            maybe_inject(topo.rank, step)
            lr = lr_at(step, job.schedule)
            loss_sum += train_step(job, x, y, lr)
            n += 1
            step += 1
            samples += loader.global_batch
            if bar:
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss_sum) / n:.3f}", lr=f"{lr:.3g}", refresh=False)
        mean_loss = float(comm_lib.allreduce_sum([float(loss_sum), n], topo.comm)[0]) / max(n * topo.size, 1)
        rec = {"epoch": epoch, "step": step, "train_loss": mean_loss, "lr": lr_at(max(step - 1, 0), job.schedule),
               "epoch_s": time.perf_counter() - t_epoch}
        if cfg.train.eval_every and (epoch + 1) % cfg.train.eval_every == 0:
            rec.update(evaluate(job))
        log.log("epoch", **rec)
        if step >= total_steps:
            break
    train_s = time.perf_counter() - t_train
    if bar:
        bar.close()
    result = evaluate(job)
    wall_s = time.perf_counter() - t0
    epochs_done = step / loader.steps
    summary = log.log("summary", **result, samples_per_s=samples / train_s, wall_s=wall_s, train_s=train_s,
                      world_size=topo.size, steps=step, epochs=epochs_done, global_batch=loader.global_batch,
                      strategy=cfg.comm.strategy, compression=cfg.comm.compression,
                      **gpu_time(wall_s, topo.size, epochs_done))
    log.close()
    job.sync.close()
    topo.close()
    return summary
