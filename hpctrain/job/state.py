"""What the job's modules share once set-up is done: the run's options as plain values
(:class:`RunOptions`), its built parts (:class:`Job`) and the loop's position (:class:`Progress`).

No config section crosses this line: :mod:`hpctrain.job.setup` reads the config once into these,
and the loop, the observers, the results and the runner read them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hpctrain.data import ShardLoader, ShardSet
from hpctrain.ops.metrics import StepTimer
from hpctrain.topology import Topology
from hpctrain.trainer import DistributedTrainer


@dataclass(frozen=True)
class RunOptions:
    """The options the job itself acts on (the library's parts take theirs as keywords)."""
    run_dir: str
    ckpt_dir: str                   # '' : RUN_DIR/checkpoints
    resume: str
    progress: bool
    timeline: bool
    watchdog_s: float
    watchdog_abort_s: float
    tensorboard: bool
    device: str                     # as asked (auto, cpu, cuda): the start-up line says why
    epochs: int
    max_steps: int
    eval_every: int
    unaugmented_epochs: int
    collapse_steps: int
    on_collapse: str
    polish: bool                    # Final Polishing's BN recompute
    polish_batches: int
    ckpt_every_steps: int
    ckpt_keep: int
    strategy: str                   # the summary's names
    compression: str
    algorithm: str
    config: dict = field(default_factory=dict)      # the config as run (the recipe's values): recorded


@dataclass
class Job:
    """Everything set up for a run (what :func:`hpctrain.job.setup.setup` returns)."""
    options: RunOptions
    topo: Topology
    trainer: DistributedTrainer
    loader: ShardLoader
    test_set: ShardSet
    timer: StepTimer
    device: torch.device = torch.device("cpu")
    normalise_on_device: bool = False   # batches cross as stored; normalised (and augmented) on the device
    lr_line: str = ""          # the start-up line's lr and why (optim.recipe = "auto": the recipe's line)

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model


@dataclass
class Progress:
    """What the training loop has done so far: what the observers see, and the summary's inputs."""
    start_step: int
    total_steps: int = 0
    epoch: int = 0
    step: int = 0                   # optimiser steps taken (the trainer's count)
    lr: float | None = None         # the last step's
    loss: Any = None                # the last step's loss (a tensor: read only where needed)
    epoch_loss: Any = None          # [sum of finite step losses, their count] of this epoch, on the device
    samples: int = 0
    skipped: int = 0
    stopped: bool = False           # a stop signal agreed: the run ends resumable, not evaluated
    train_s: float = 0.0
    breakdown: dict = field(default_factory=dict)
    train_loss: float | None = None     # the last epoch's (the summary's)
    at_chance: float | None = None      # the smoothed loss, if the run never learned and ends at chance
