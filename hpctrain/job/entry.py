"""The training job's entry (``python -m hpctrain [train]``): the early refusal before MPI and
torch start, then the config read and validated on every rank, the run, and the exit status of
each way it can end (docs/operations.md). ``MPI.COMM_WORLD`` is taken here and handed down;
library code below takes a communicator."""
from __future__ import annotations

import sys

from hpctrain.job.args import config_from_args, early_look


def refused_early(early: dict[str, str] | None) -> bool:
    """Before MPI and torch (seconds of imports, a minute on a busy node): whether another job
    holds this run's directory; launcher rank 0 prints the line. The job still takes the lock
    itself later (:func:`hpctrain.ops.runlock.hold_run_dirs`): this look only refuses sooner."""
    from hpctrain.ops.runlock import held_run_dir, launcher_rank
    if early is None:
        return False
    line = held_run_dir([early["run.run_dir"]] + ([early["ckpt.dir"]] if early["ckpt.dir"] else []))
    if line and launcher_rank() in (0, None):
        print(f"hpctrain: error: {line}", file=sys.stderr, flush=True)
    return line is not None


def train_main(argv: list[str]) -> int:
    """Train as ``argv`` says; the exit status (0 done, 2 refused, 3 stopped by a signal, 6 collapsed)."""
    from hpctrain.ops import gpu_bind
    early = early_look(argv)
    if refused_early(early):
        return 2
    gpu_bind.early_bind(early["train.device"] if early else None)    # before MPI_Init: a CUDA-aware MPI's context
    from mpi4py import MPI

    from hpctrain.errors import TrainingCollapsed, UserError
    from hpctrain.job.config import ConfigError, validate
    from hpctrain.ops.abort import install_abort_hook
    from hpctrain.ops.agree import agree
    from hpctrain.ops.signals import Stopped
    comm = MPI.COMM_WORLD
    install_abort_hook(comm)
    try:
        cfg, error = None, None
        try:
            cfg = config_from_args(argv)
            validate(cfg, comm.Get_size())
        except ConfigError as exc:
            error = exc
        agree(comm, error)          # a file-system check may fail on one node only: stop every rank
        assert cfg is not None              # agree raised otherwise
        from hpctrain.job import run
        summary = run(cfg, comm)
    except Stopped as exc:          # SIGTERM/SIGUSR1: checkpoint written, resumable
        if comm.Get_rank() == 0:
            print(f"hpctrain: {exc}", file=sys.stderr)
        return 3
    except TrainingCollapsed as exc:        # the loss went back to chance: not "done" (docs/operations.md)
        if comm.Get_rank() == 0:
            print(f"hpctrain: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except UserError as exc:
        if isinstance(exc, UserError) and not exc.agreed:
            raise                   # this rank's alone: the abort hook prints it and ends every rank
        if comm.Get_rank() == 0:
            print(f"hpctrain: error: {exc}", file=sys.stderr)
        return 2
    if comm.Get_rank() == 0:
        print(format_summary(summary))
    return 0


def format_summary(s: dict) -> str:
    top5 = f" (top-5 {100 * s['test_top5_accuracy']:.2f}%)" if "test_top5_accuracy" in s else ""
    return (f"test accuracy {100 * s['test_accuracy']:.2f}%{top5} | {s['samples_per_s']:.0f} samples/s | "
            f"wall {s['wall_s']:.1f} s | {s['world_size']} ranks | GPU-time {s['gpu_time_s']:.1f} s "
            f"({s['avg_single_gpu_time_per_epoch_s']:.2f} s/epoch) | {s['strategy']}/{s['compression']}")
