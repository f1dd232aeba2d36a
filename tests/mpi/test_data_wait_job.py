"""The job says when input is the bottleneck: each epoch's data-wait share in metrics.jsonl, and
one warning on rank 0 naming the slowest-fed rank when it passes 10 %, none when the loader keeps up.
The floor of seconds lost before a warning (``MIN_WAIT_S``, 10 s) is lowered to fit a test run.

The loader is made slow (or the step slow, so that any loader keeps up) by wrapping what the job
iterates: a sleep before each batch on the last rank stands for a loader that cannot decode fast
enough there, whatever the loader's insides.
"""
import json
import os
import time

import pytest
from mpi4py import MPI

from hpctrain import job as job_mod
from hpctrain.job import loop as loop_mod
from hpctrain.job.observers import faults as faults_mod
from hpctrain.ops import datawait
from hpctrain.job.config import Config
from hpctrain.ops.datawait import THRESHOLD

PAUSE_S = 0.1


@pytest.fixture
def cfg(digits_dir, tmp_path):
    comm = MPI.COMM_WORLD
    cfg = Config()
    cfg.data.cache_dir = os.path.dirname(digits_dir)
    cfg.run.run_dir = comm.bcast(str(tmp_path), root=0)
    cfg.run.progress = False
    cfg.train.epochs = 3
    cfg.train.eval_every = 0
    cfg.train.batch_size = 128       # few steps an epoch at any -n
    return cfg


@pytest.fixture(autouse=True)
def short_floor(monkeypatch):
    monkeypatch.setattr(datawait, "MIN_WAIT_S", 2 * PAUSE_S)


def records(run_dir, event):
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [r for r in map(json.loads, fh) if r["event"] == event]


def run_job(cfg, capsys):
    comm = MPI.COMM_WORLD
    job_mod.run(cfg, comm)
    err = capsys.readouterr().err
    comm.Barrier()                   # rank 0's metrics.jsonl is complete before anyone reads it
    return err


@pytest.mark.mpi
def test_a_slow_loader_on_one_rank_is_named_once(cfg, capsys, monkeypatch):
    comm = MPI.COMM_WORLD
    slow_rank = comm.size - 1
    timed = loop_mod.timed_batches

    def slow(batches):
        for item in batches:
            if comm.rank == slow_rank:
                time.sleep(PAUSE_S)
            yield item
    monkeypatch.setattr(loop_mod, "timed_batches", lambda batches, timer: timed(slow(batches), timer))
    err = run_job(cfg, capsys)
    if comm.rank == 0:
        assert err.count("input is the bottleneck") == 1, err
        assert f"rank {slow_rank} has waited for batches" in err and "data.workers" in err and "data.decode" in err
        (warning,) = records(cfg.run.run_dir, "warning")
        assert warning["epoch"] in (0, 1) and warning["message"] in err
        epochs = records(cfg.run.run_dir, "epoch")
        assert [e["epoch"] for e in epochs] == [0, 1, 2]
        for e in epochs:
            assert e["data_wait_share"] == pytest.approx(e["phases_s"]["data"] / e["epoch_s"])   # rank 0's own
            assert e["data_wait_rank"] == slow_rank and e["data_wait_share_max"] > THRESHOLD
    else:
        assert "input is the bottleneck" not in err                 # rank 0 alone says it


@pytest.mark.mpi
def test_a_loader_that_keeps_up_says_nothing(cfg, capsys, monkeypatch):
    comm = MPI.COMM_WORLD
    monkeypatch.setattr(faults_mod, "maybe_inject", lambda rank, step: time.sleep(PAUSE_S))   # a slow step
    err = run_job(cfg, capsys)
    if comm.rank == 0:
        assert "input is the bottleneck" not in err, err
        assert records(cfg.run.run_dir, "warning") == []
        epochs = records(cfg.run.run_dir, "epoch")
        assert len(epochs) == 3
        assert all(0 <= e["data_wait_share"] <= e["data_wait_share_max"] < THRESHOLD for e in epochs[1:])
