"""The CLI's training job: config → topology → data → model → DistributedTrainer → metrics.

The one place that knows every part: :mod:`~hpctrain.job.setup` builds them from the config,
:mod:`~hpctrain.job.loop` trains, :mod:`~hpctrain.job.results` evaluates and summarises. The
step itself is :class:`~hpctrain.trainer.DistributedTrainer`'s, the same one user scripts call,
so the CLI and the library API share one code path.
"""
from __future__ import annotations

import contextlib
import os
import time

from mpi4py import MPI

from hpctrain.job.agreed import on_agreed_exit
from hpctrain.job.config import Config
from hpctrain.job.console import startup_line
from hpctrain.job.loop import train
from hpctrain.job.observers.collapse import check_ended_at_chance
from hpctrain.job.results import summarise
from hpctrain.job.setup import checkpointer, observers, run_options, setup
from hpctrain.ops import tensorboard
from hpctrain.ops.checkpoint import resume_spec
from hpctrain.ops.metrics import MetricsLog
from hpctrain.ops.rundir import RunDirectory
from hpctrain.ops.signals import Stopped, StopSignal
from hpctrain.ops.watchdog import busy, start_watchdog
from hpctrain.saved.spec import SPEC_NAME, run_spec, write_spec
from hpctrain.saved.weights import keep_polished


def run(cfg: Config, comm: MPI.Comm) -> dict:
    """Train and evaluate; returns the summary (identical on every rank).

    Phases: set-up, resume, train, then stop (signal) or evaluate and summarise. Everything
    opened is registered on one ``ExitStack`` and released on every exit path — collective
    parts on a normal exit or an agreed error (:func:`on_agreed_exit`), local ones always.
    """
    t0 = time.perf_counter()
    options = run_options(cfg)         # the config read once: below, plain values
    with contextlib.ExitStack() as stack:
        # the run directory (and a checkpoint directory of its own) is this job's alone, from here
        rundir = stack.enter_context(RunDirectory(comm, options.run_dir, options.ckpt_dir))
        watchdog = start_watchdog(comm, options.watchdog_s, options.watchdog_abort_s, stack, on_agreed_exit)
        # SIGTERM/SIGUSR1/SIGINT → checkpoint and stop; from here, so a signal during set-up is
        # not lost (nor fatal): it is acted on at the first step
        stop = StopSignal(comm)
        stack.push(on_agreed_exit(stop.close))
        job = setup(cfg, comm, stack, watchdog)
        options = job.options              # the config as run (optim.recipe = "auto" applied): recorded below
        resuming = bool(resume_spec(options.resume))
        run_id = rundir.identity(job.topo.comm, fresh=not resuming)
        ckpt = checkpointer(options, job.topo.comm, job.loader, job.timer, run_id)
        resumed = ckpt.resume(job.trainer, options.resume)      # None, or where to continue
        log = stack.enter_context(contextlib.closing(
            MetricsLog(options.run_dir, enabled=job.topo.rank == 0, append=resuming)))
        tensorboard.observe(log, options.tensorboard, options.run_dir, job.trainer.step_count, stack)
        if job.topo.rank == 0:                                    # what export and evaluate rebuild the model from
            write_spec(os.path.join(options.run_dir, SPEC_NAME),
                       run_spec(options.config, job.loader.shards.index, run_id, ckpt.directory, options.run_dir))
        if watchdog is not None:                                  # the run's last record says why it ended
            watchdog.on_abort = rundir.on_stall(log, lambda: job.trainer.step_count)
        if job.topo.rank == 0:
            print(startup_line(job), flush=True)
        log.log("config", config=options.config, run_id=run_id, world_size=job.topo.size,
                topology=job.topo.describe(), data=job.loader.describe(), test_data=job.test_set.describe(),
                steps_per_epoch=job.loader.steps, resumed_from=ckpt.last_path if resumed else None,
                start_step=job.trainer.step_count)
        watchers = observers(job, ckpt, log, stack, watchdog, resumed is not None)
        progress = train(job, watchers, stop, *((resumed.epoch, resumed.step_in_epoch) if resumed else (0, 0)))
        if stop.agreed:
            step, where = job.trainer.step_count, ckpt.last_path
            log.log("stopped", signal=stop.name, step=step, checkpoint=where, train_s=progress.train_s)
            rundir.record("stopped", signal=stop.name, step=step, checkpoint=where)
            raise Stopped(f"stopped by {stop.name} at step {step} after writing {where}; continue with "
                          f"--set ckpt.resume=auto")
        with busy(watchdog, "evaluation"):
            summary = summarise(job, log, progress, t0)
        if options.polish and job.topo.rank == 0:               # polished after the final checkpoint
            keep_polished(options.run_dir, ckpt.last_path, job.model)
        check_ended_at_chance(job, progress, summary, log)    # a net that learned nothing is not "done"
        rundir.record("done", steps=summary["steps"], test_accuracy=summary["test_accuracy"])
        return summary
