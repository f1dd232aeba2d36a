"""The training loop and its observers: every hook of every observer, in the listed order, at the
step and epoch the loop is at; an observer added to the list sees the run without a line of the
loop changed. One rank (``COMM_SELF``): the loop's only collective is the epoch loss's sum."""
from types import SimpleNamespace

import pytest
import torch
from mpi4py import MPI

from hpctrain.job.loop import train
from hpctrain.job.observers import Observer
from hpctrain.job.state import Job, Progress
from hpctrain.ops.metrics import StepTimer

STEPS_PER_EPOCH = 3


class Loader:
    steps, global_batch = STEPS_PER_EPOCH, 4

    def __init__(self):
        self.asked = []

    def epoch(self, epoch, skip=0, augment=True):
        self.asked.append((epoch, skip, augment))
        for i in range(skip, self.steps):
            yield torch.full((4, 1), float(i)), torch.zeros(4, dtype=torch.long)

    def batch_prep(self, epoch, augment, skip=0):
        return None


class Trainer:
    """Loss 2, 1, 0.5, ... of each step (the k-th step's 2 / 2**k), lr 0.1 per step taken."""

    def __init__(self, step_count=0):
        self.step_count = step_count

    def lr(self):
        return 0.1 * (self.step_count + 1)

    def step(self, x, y):
        loss = torch.tensor(2.0 / 2 ** self.step_count)
        self.step_count += 1
        return SimpleNamespace(loss=loss, skipped=0)


def make_job(epochs=2, max_steps=0, unaugmented_epochs=0, start_step=0):
    options = SimpleNamespace(epochs=epochs, max_steps=max_steps, unaugmented_epochs=unaugmented_epochs)
    return Job(options=options, topo=SimpleNamespace(comm=MPI.COMM_SELF, rank=0, size=1),   # type: ignore[arg-type]
               trainer=Trainer(start_step), loader=Loader(), test_set=None, timer=StepTimer())  # type: ignore[arg-type]


class Never:
    agreed, name = False, None

    def poll(self):
        return False


class Recorder(Observer):
    """Writes down each hook with what the loop shows it at that moment."""

    def __init__(self, name, seen):
        self.name, self.seen = name, seen

    def start(self, progress):
        self.seen.append((self.name, "start", progress.step))

    def before_step(self, progress):
        self.seen.append((self.name, "before_step", progress.step))

    def after_step(self, progress):
        self.seen.append((self.name, "after_step", progress.step, float(progress.loss), progress.lr))

    def after_epoch(self, progress, record):
        self.seen.append((self.name, "after_epoch", record["epoch"], record["step"], record["train_loss"]))
        record[self.name] = True           # visible to the observers after this one

    def end(self, progress):
        self.seen.append((self.name, "end", progress.step, progress.train_s))

    def close(self, progress):
        self.seen.append((self.name, "close", progress.step, progress.train_s > 0))


def test_each_hook_of_each_observer_in_order_with_the_loops_position():
    seen = []
    job = make_job(epochs=2)
    progress = train(job, [Recorder("a", seen), Recorder("b", seen)], Never())
    losses = [2.0 / 2 ** k for k in range(6)]
    want = [("a", "start", 0), ("b", "start", 0)]
    for epoch in range(2):
        for k in range(3 * epoch, 3 * epoch + 3):
            want += [("a", "before_step", k), ("b", "before_step", k)]
            want += [(o, "after_step", k + 1, losses[k], pytest.approx(0.1 * (k + 1))) for o in "ab"]
        mean = sum(losses[3 * epoch:3 * epoch + 3]) / 3
        want += [(o, "after_epoch", epoch, 3 * epoch + 3, pytest.approx(mean)) for o in "ab"]
    want += [("a", "end", 6, 0.0), ("b", "end", 6, 0.0), ("a", "close", 6, True), ("b", "close", 6, True)]
    assert seen == want
    assert progress.samples == 6 * 4 and progress.train_loss == pytest.approx(sum(losses[3:]) / 3)


def test_a_record_field_added_by_one_observer_reaches_the_next():
    fields = []

    class Reader(Observer):
        def after_epoch(self, progress, record):
            fields.append(sorted(k for k in record if k in "ab"))
    train(make_job(epochs=1), [Recorder("a", []), Reader(), Recorder("b", [])], Never())
    assert fields == [["a"]]


def test_max_steps_and_a_resume_mid_epoch_bound_the_steps_the_observers_see():
    seen = []
    job = make_job(epochs=3, max_steps=7, start_step=4)       # resumed after step 4: epoch 1, one step in
    progress = train(job, [Recorder("a", seen)], Never(), first_epoch=1, skip=1)
    steps = [s[2] for s in seen if s[1] == "before_step"]
    assert steps == [4, 5, 6] and progress.start_step == 4 and progress.step == 7
    assert job.loader.asked == [(1, 1, True), (2, 0, True)]      # the epoch resumed where it was, then the next
    assert [s[2] for s in seen if s[1] == "after_epoch"] == [1, 2]


def test_a_stop_agreed_ends_the_epoch_and_is_shown_to_end():
    class StopAfterTwo(Never):
        polls = 0

        def poll(self):
            self.polls += 1
            self.agreed = self.polls >= 2
            return self.agreed
    stopped = []

    class Watch(Observer):
        def end(self, progress: Progress):
            stopped.append((progress.step, progress.stopped))
    train(make_job(epochs=2), [Watch()], StopAfterTwo())
    assert stopped == [(2, True)]


def test_the_last_unaugmented_epochs_ask_the_loader_for_plain_data():
    job = make_job(epochs=3, unaugmented_epochs=1)
    train(job, [], Never())
    assert [a[2] for a in job.loader.asked] == [True, True, False]
