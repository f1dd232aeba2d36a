"""The per-step budget's bookkeeping (exclusive time adds up to the step) and the floor's byte
count per strategy, against counts made independently here. No timings: a fake clock."""
from __future__ import annotations

import pytest
import torch
from mpi4py import MPI

from hpctrain.comm.ring import chunk_bounds
from hpctrain.ops.budget import NULL_PROBE, OTHER, PhaseBudget
from hpctrain.tools.bench.budget import per_step
from hpctrain.tools.bench.floor import copies_per_step, syncs_per_step


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def advance(self, s):
        self.now += s


def test_nested_spans_are_charged_exclusively_and_add_up_to_the_step():
    clock = FakeClock()
    budget = PhaseBudget(clock=clock)

    def step():
        clock.advance(1)                        # other
        with budget.span("allreduce"):
            clock.advance(2)                    # allreduce's own
            with budget.span("pack", 0):
                clock.advance(3)
            with budget.span("reduce.node", 0):
                clock.advance(4)
                with budget.span("wait", 0):
                    clock.advance(5)
            clock.advance(6)                    # allreduce's own again
        clock.advance(7)                        # other

    wall = budget.step(step)
    totals = budget.reset()
    assert wall == 28
    assert totals == {(OTHER, -1): 8, ("allreduce", -1): 8, ("pack", 0): 3, ("reduce.node", 0): 4, ("wait", 0): 5}
    assert sum(totals.values()) == wall


def test_time_between_steps_is_not_charged():
    clock = FakeClock()
    budget = PhaseBudget(clock=clock)
    budget.step(lambda: clock.advance(2))
    clock.advance(100)                          # the caller's loop, between steps
    budget.step(lambda: clock.advance(3))
    assert budget.reset() == {(OTHER, -1): 5}


def test_a_span_left_by_an_exception_still_closes():
    clock = FakeClock()
    budget = PhaseBudget(clock=clock)

    def step():
        with budget.span("forward"):
            clock.advance(2)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        budget.step(step)
    assert {k: v for k, v in budget.reset().items() if v} == {("forward", -1): 2}


def test_sinks_get_every_span_with_its_bucket():
    clock, seen = FakeClock(), []
    budget = PhaseBudget(sinks=[lambda *a: seen.append(a)], clock=clock)
    with budget.span("pack", 3):
        clock.advance(1)
    with budget.span("forward"):
        clock.advance(2)
    assert seen == [("pack[3]", 0, 1), ("forward", 1, 2)]


def test_tags_say_what_a_bucket_waits_for():
    budget = PhaseBudget()
    assert budget.tagged(1, "reduce.node") == "reduce.node"
    budget.tag(1, "wait")
    assert budget.tagged(1, "reduce.node") == "wait" and budget.tagged(2, "x") == "x"
    budget.tag(1, None)
    assert budget.tagged(1, "reduce.node") == "reduce.node"


def test_the_null_probe_records_nothing():
    with NULL_PROBE.span("pack", 0):
        NULL_PROBE.tag(0, "wait")
    assert not hasattr(NULL_PROBE, "__dict__")


def test_per_step_divides_and_groups_by_bucket():
    phases, buckets = per_step({("pack", 0): 2.0, ("pack", 1): 4.0, ("forward", -1): 8.0}, steps=2)
    assert phases == {"pack": 3.0, "forward": 4.0}
    assert buckets == {0: {"pack": 1.0}, 1: {"pack": 2.0}}


def hierarchical_bytes(sizes_elems, n, itemsize=4):
    """Each local rank j reads slice j of every rank's input and writes it to every rank's
    output (hpctrain.comm.hierarchical); in copy bytes (a copy reads b and writes b: b), mean
    over the ranks."""
    total = 0
    for n_elems in sizes_elems:
        bounds = chunk_bounds(n_elems, n)
        for j in range(n):
            sl = (bounds[j + 1] - bounds[j]) * itemsize
            read, written = n * sl, n * sl
            total += (read + written) / 2
    return total / n


def ring_bytes(sizes_elems, n, itemsize=4):
    """The ring (hpctrain.comm.ring): rank r sends n-1 chunks in the reduce-scatter and n-1 in
    the allgather (a copy each) and adds n-1 chunks (reads two, writes one: 1.5 copies)."""
    total = 0
    for n_elems in sizes_elems:
        bounds = chunk_bounds(n_elems, n)
        size = [(bounds[i + 1] - bounds[i]) * itemsize for i in range(n)]
        for r in range(n):
            sent = sum(size[(r - s) % n] for s in range(n - 1)) + sum(size[(r - s + 1) % n] for s in range(n - 1))
            added = sum(size[(r - s - 1) % n] for s in range(n - 1))
            total += sent + 1.5 * added
    return total / n


@pytest.mark.parametrize("n", [2, 3, 4])
def test_floor_bytes_of_hierarchical_against_its_slices(n):
    sizes = [1000, 4096, 7]
    assert copies_per_step("hierarchical", [s * 4 for s in sizes], n, [False] * 3) == \
        pytest.approx(hierarchical_bytes(sizes, n))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_floor_bytes_of_flat_against_the_ring(n):
    sizes = [1200, 4096]
    assert copies_per_step("flat", [s * 4 for s in sizes], n, [False, False]) == \
        pytest.approx(ring_bytes(sizes, n))


def test_floor_bytes_of_flat_fp16_halve_the_ring_and_add_pack_and_unpack():
    sizes = [4096]
    pack = unpack = 4096 * 4 * (1 + 0.5) / 2       # reads G fp32, writes G/2 fp16 (and back)
    assert copies_per_step("flat", [4096 * 4], 2, [True]) == pytest.approx(ring_bytes(sizes, 2) / 2 + pack + unpack)


def test_one_rank_moves_nothing_and_syncs_nothing():
    assert copies_per_step("hierarchical", [4000], 1, [False]) == 0
    assert syncs_per_step("flat", 3, 1) == 0
    assert syncs_per_step("hierarchical", 3, 2) == 6 and syncs_per_step("flat", 3, 2) == 3


def test_the_instrument_leaves_a_one_rank_trainer_as_it_was():
    from hpctrain.tools.bench.budget import instrument
    from hpctrain.topology import Topology
    from hpctrain.trainer import DistributedTrainer
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    topo = Topology.create(MPI.COMM_SELF)
    trainer = DistributedTrainer(model, opt, topo, strategy="flat")
    guard, timer = trainer.algo.guard, trainer.algo.timer
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    try:
        budget = PhaseBudget()
        with instrument(trainer, opt, budget):
            budget.step(lambda: trainer.step(x, y))
        phases, _ = per_step(budget.reset(), 1)
        assert {"zero_grad", "forward", "backward", "pack", "reduce.node", "unpack", "optimizer", "check",
                "update"} <= set(phases)
        assert trainer.algo.guard is guard and trainer.algo.timer is timer
        assert trainer.grad_sync.probe is NULL_PROBE
        assert "step" not in vars(trainer.algo) and "zero_grad" not in vars(opt)
    finally:
        trainer.close()
        topo.close()
