"""Start-up consistency check, stop-signal agreement and the stall watchdog, across ranks.

``mpiexec -n 2 .venv/bin/python -m pytest --only-mpi --color=no tests/mpi/test_ops_faults.py``
(also at -n 4). Each rank checks the same verdict; the failure hook makes any rank's failure fail all.
"""
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI
from torch import nn

from hpctrain.errors import UserError
from hpctrain.ops.agree import AgreedError, ConsistencyError, agree, check_consistency
from hpctrain.ops.signals import StopSignal
from hpctrain.ops.watchdog import SLOTS_PER_STEP, Watchdog, compress_ranks, describe_stall

CFG = {"train": {"batch_size": 64, "seed": 0}, "optim": {"lr": 0.1}}


def model(width=4):
    return nn.Sequential(nn.Linear(3, width), nn.BatchNorm1d(width), nn.Linear(width, 2))


@pytest.mark.mpi(min_size=2)
def test_same_model_and_config_pass(world):
    check_consistency(world, model(), CFG, {"torch": torch.__version__})


@pytest.mark.mpi(min_size=2)
def test_odd_model_names_its_rank(world):
    odd = world.Get_size() - 1
    m = model(5 if world.Get_rank() == odd else 4)
    with pytest.raises(ConsistencyError) as info:
        check_consistency(world, m, CFG)
    msg = str(info.value)
    # on a 2-rank tie rank 0 is the reference; with more ranks the majority is
    assert f"the model on rank {odd} differs from rank 0's" in msg
    assert "'0.weight (5, 3) torch.float32' where the reference has '0.weight (4, 3) torch.float32'" in msg
    assert "config" not in msg.split("(every")[0]
    # the verdict is identical on every rank
    assert len(set(world.allgather(msg))) == 1


@pytest.mark.mpi(min_size=3)
def test_odd_config_and_software_against_the_majority(world):
    odd = 1
    cfg = {"train": {"batch_size": 128 if world.Get_rank() == odd else 64, "seed": 0}, "optim": {"lr": 0.1}}
    with pytest.raises(ConsistencyError, match=rf"the config on rank {odd} differs from rank 0's: rank {odd} has "
                                        r"'train.batch_size = 128' where the reference has 'train.batch_size = 64'"):
        check_consistency(world, model(), cfg)
    soft = {"torch": "2.13.0" if world.Get_rank() != odd else "2.12.0"}
    with pytest.raises(ConsistencyError, match=rf"rank {odd} has 'version torch = 2.12.0'"):
        check_consistency(world, model(), CFG, soft)


@pytest.mark.mpi(min_size=2)
def test_a_rank_on_another_kernel_path_is_named(world, monkeypatch):
    """On a GPU the job's software includes the kernel path: a rank whose CuPy failed (torch's
    reference kernels) would round its fp16 packing differently, so the start-up check names it."""
    from hpctrain import kernels
    from hpctrain.job import setup as job
    odd = world.Get_size() - 1
    monkeypatch.setattr(kernels, "backend", lambda: ("cpu", "no CuPy") if world.Get_rank() == odd else ("cuda", "ok"))
    assert "kernels" not in job.software(torch.device("cpu"))          # no probe off the GPU
    with pytest.raises(ConsistencyError, match=rf"rank {odd} has 'version kernels = cpu' where the reference "
                                               r"has 'version kernels = cuda'"):
        check_consistency(world, model(), CFG, job.software(torch.device("cuda")))


@pytest.mark.mpi(min_size=2)
def test_rank_that_failed_earlier_meets_the_check_without_a_hang(world):
    """Rank 1 failed before the check and calls agree(); the others are in check_consistency."""
    error = None
    with pytest.raises(UserError, match="rank 1: shard file broken"):
        try:                                      # what train.setup does
            if world.Get_rank() == 1:
                raise OSError("shard file broken")
            check_consistency(world, model(), CFG)
        except (OSError, ValueError) as exc:
            error = exc
        agree(world, error)
    assert isinstance(error, OSError if world.Get_rank() == 1 else AgreedError)
    world.Barrier()                               # nobody is left inside a collective


@pytest.mark.mpi(min_size=2)
def test_stop_signal_is_agreed_at_the_same_step(world, closer):
    stop = closer(StopSignal(world))
    sender, sent_at = world.Get_size() - 1, 3
    seen = None
    for i in range(20):
        if world.Get_rank() == sender and i == sent_at:
            os.kill(os.getpid(), signal.SIGUSR1)
        if stop.poll():
            seen = i
            break
    assert stop.name == "SIGUSR1"
    # every rank stops at the same poll, one or two polls after the signal (pipelined agreement)
    assert set(world.allgather(seen)) == {seen} and sent_at + 1 <= seen <= sent_at + 2
    assert stop.local == (signal.SIGUSR1 if world.Get_rank() == sender else 0)
    stop.close()                                                      # under test: restores the handler
    assert signal.getsignal(signal.SIGUSR1) is not stop._handler     # handler restored


@pytest.mark.mpi(min_size=2)
def test_no_signal_no_stop(world, closer):
    stop = closer(StopSignal(world))                                  # close completes the request in flight
    assert not any(stop.poll() for _ in range(10))


def test_describe_stall_and_rank_ranges():
    assert compress_ranks([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    names = ["forward", "backward", "allreduce"]
    s = 57 * SLOTS_PER_STEP
    text = describe_stall([s + 2, s + 2, s + 1, s + 2], names, 31.2)
    assert text == ("no progress for 31 s: rank 2 is after 'forward' of step 57; "
                    "ranks 0-1, 3 wait after 'backward' of step 57")
    text = describe_stall([s, s + 1, s + 1, s + 3], names, 5)
    assert text == ("no progress for 5 s: rank 0 is at the start of step 57; ranks 1-2 are after 'forward' of "
                    "step 57; rank 3 waits after 'allreduce' of step 57")
    assert "all 2 ranks are at the start of step 3" in describe_stall([3 * SLOTS_PER_STEP] * 2, names, 5)
    # a rank whose heartbeat stopped is named even where its progress equals the others'
    text = describe_stall([s + 2] * 4, names, 9, silent={2: 8.7})
    assert text == ("no progress for 9 s: rank 2 is after 'backward' of step 57, silent for 9 s (stopped, or its "
                    "node is down); ranks 0-1, 3 wait after 'backward' of step 57")
    text = describe_stall([s + 2, s + 1, s + 1, s + 2], names, 9, silent={1: 9.0, 3: 8.0})
    assert text == ("no progress for 9 s: rank 2 is after 'forward' of step 57; rank 1 is after 'forward' of step "
                    "57, silent for 9 s (stopped, or its node is down); rank 3 is after 'backward' of step 57, "
                    "silent for 8 s (stopped, or its node is down); rank 0 waits after 'backward' of step 57")


@pytest.mark.mpi(min_size=2)
def test_watchdog_names_the_late_rank(world, closer):
    reports = []
    wd = closer(Watchdog(world, timeout_s=0.4, report=reports.append, poll_s=0.05))
    late = world.Get_size() - 1
    for step in range(2):
        wd.step(step)
        wd("forward", 0.0, 0.0)
        if world.Get_rank() == late and step == 1:
            time.sleep(1.5)                       # this rank is slow before backward; the others wait
        wd("backward", 0.0, 0.0)
        world.Barrier()                           # "the gradient allreduce"
    wd.close()                                    # stops the watching thread: reports are final
    if world.Get_rank() == 0:
        assert reports, "no stall reported"
        others = compress_ranks([r for r in range(world.Get_size()) if r != late])
        assert f"rank {late} is after 'forward' of step 1" in reports[0], reports
        assert f"{others} wait{'' if world.Get_size() > 2 else 's'} after 'backward' of step 1" in reports[0]
        assert len(reports) <= 4                  # one report per timeout period, not per poll
    else:
        assert reports == []                      # only rank 0 watches


def process_state(pid: int) -> str:
    """``T`` for a stopped process (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rpartition(")")[2].split()[0]


@pytest.mark.mpi(min_size=2)
def test_watchdog_names_a_rank_stopped_inside_a_collective(world, closer):
    """The victim posts the same phase as every other rank, enters the "allreduce" and is stopped
    there (SIGSTOP from a thread of its own); its progress cannot tell it from the ranks waiting
    with it, its silent heartbeat does. Rank 0 continues it once a report names it. The
    "allreduce" is a broadcast then a barrier, rounds in order as a ring's are: the victim is
    stopped inside the broadcast, waiting for its data; the others pass it (their sends need
    nothing from the victim) and wait in the barrier."""
    if len(set(world.allgather(MPI.Get_processor_name()))) > 1:
        pytest.skip("signals the victim by pid: every rank on one host")
    reports = []
    wd = closer(Watchdog(world, timeout_s=1.0, report=reports.append, poll_s=0.1))
    if not wd.beats:
        pytest.skip("no MPI_THREAD_MULTIPLE: no heartbeats")
    victim, pids = world.Get_size() - 1, world.allgather(os.getpid())
    wd.step(0)
    wd("forward", 0.0, 0.0)
    wd("backward", 0.0, 0.0)                      # every rank at the same point
    world.Barrier()                               # every post has landed (MPICH: needs rank 0's progress)
    if world.Get_rank() == victim:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    else:
        deadline = time.monotonic() + 30
        while process_state(pids[victim]) != "T" and time.monotonic() < deadline:
            time.sleep(0.02)                      # the others enter once the victim is stopped in it
    named = f"rank {victim} is after 'backward' of step 0, silent for"
    if world.Get_rank() == 0:
        def resume():
            deadline = time.monotonic() + 20
            while not any(named in r for r in reports) and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(pids[victim], signal.SIGCONT)
        threading.Thread(target=resume, daemon=True).start()
    world.Bcast(np.zeros(4), root=0)              # "the gradient allreduce": the victim is stopped inside
    world.Barrier()
    wd.close()                                    # reports are final
    if world.Get_rank() == 0:
        assert any(named in r for r in reports), reports
        first = next(r for r in reports if named in r)
        others = compress_ranks(list(range(victim)))
        assert first.endswith(f"(stopped, or its node is down); {'ranks' if victim > 1 else 'rank'} {others} "
                              f"wait{'' if victim > 1 else 's'} after 'backward' of step 0"), reports
        assert all(r.count("silent for") <= 1 for r in reports), reports    # no waiting rank called silent


@pytest.mark.mpi(min_size=2)
def test_watchdog_quiet_when_steps_progress(world, closer):
    reports = []
    wd = closer(Watchdog(world, timeout_s=0.5, report=reports.append, poll_s=0.05))
    for step in range(20):
        wd.step(step)
        wd("forward", 0.0, 0.0)
        time.sleep(0.02)
        world.Barrier()
    wd.close()                                    # stops the watching thread: reports are final
    assert reports == []


@pytest.mark.mpi(min_size=2)
def test_watchdog_window_is_freed(world, closer):
    handles = []
    for _ in range(3):                            # repeated set-up/tear-down must not leak or hang
        wd = closer(Watchdog(world, timeout_s=10))
        assert wd.win != MPI.WIN_NULL and wd.comm != MPI.COMM_NULL
        assert MPI.Comm.Compare(wd.comm, world) == MPI.CONGRUENT      # its own duplicate of world
        handles.append({wd.comm.py2f(), wd.win.py2f(), *([wd.beat_win.py2f()] if wd.beat_win != MPI.WIN_NULL else [])})
        wd.close()
        assert wd.win == MPI.WIN_NULL, "close() did not free the window"
        assert wd.comm == MPI.COMM_NULL, "close() did not free the duplicated communicator"
        assert not [t for t in threading.enumerate() if t.name == "hpctrain-watchdog"]   # thread stopped
        wd.close()                                # a second close is a no-op (no Barrier/Free on null)
        assert wd.win == MPI.WIN_NULL and wd.comm == MPI.COMM_NULL
    # MPI hands freed handle slots to the next Dup/Allocate (in either order: two windows a round);
    # a leak would take new slots every round
    assert all(h == handles[0] for h in handles), handles
