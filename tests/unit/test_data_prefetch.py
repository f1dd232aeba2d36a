"""The loader's thread and its resume state (hpctrain.data.prefetch) with a fake reading strategy:
which epochs a running thread hands over, when a fresh thread starts, and that the reading is
started and cancelled around each fresh thread."""
import pytest

from hpctrain.data.prefetch import EpochsAhead, LoaderStats

STEPS = 3


class FakeReading:
    """Records what the loader's thread asks of its reading strategy."""

    def __init__(self, per_epoch: bool):
        self.per_epoch = per_epoch
        self.calls: list[tuple] = []

    def start(self, epoch, skip, augment):
        self.calls.append(("start", epoch, skip, augment))

    def cancel(self):
        self.calls.append(("cancel",))


def batches(made):
    def make(epoch, skip, augment):
        made.append((epoch, skip, augment))
        for k in range(skip, STEPS):
            yield epoch, k, augment
    return make


def epoch_items(epoch, skip=0, augment=True):
    return [(epoch, k, augment) for k in range(skip, STEPS)]


@pytest.fixture
def ahead_of():
    made = []

    def build(per_epoch):
        reading = FakeReading(per_epoch)
        ahead = EpochsAhead(batches(made), reading, depth=2, stats=LoaderStats())
        built.append(ahead)
        return ahead, reading, made
    built: list[EpochsAhead] = []
    yield build
    for a in built:
        a.stop()


def test_the_next_epoch_comes_from_the_thread_already_running(ahead_of):
    ahead, reading, made = ahead_of(per_epoch=False)
    assert list(ahead.epoch(0, 0, True)) == epoch_items(0)
    assert list(ahead.epoch(1, 0, True)) == epoch_items(1)
    assert reading.calls == [("cancel",), ("start", 0, 0, True)]      # one thread for both epochs
    assert made[:2] == [(0, 0, True), (1, 0, True)]


@pytest.mark.parametrize("skip, augment", [(1, True), (0, False)])
def test_a_resumed_or_differently_augmented_epoch_starts_a_fresh_thread(ahead_of, skip, augment):
    ahead, reading, _ = ahead_of(per_epoch=False)
    assert list(ahead.epoch(0, 0, True)) == epoch_items(0)
    assert list(ahead.epoch(1, skip, augment)) == epoch_items(1, skip, augment)
    assert reading.calls[2:] == [("cancel",), ("start", 1, skip, augment)]


def test_an_abandoned_epoch_is_read_again_from_its_start(ahead_of):
    ahead, reading, _ = ahead_of(per_epoch=False)
    it = ahead.epoch(0, 0, True)
    assert next(it) == (0, 0, True)
    assert list(ahead.epoch(0, 0, True)) == epoch_items(0)
    assert reading.calls == [("cancel",), ("start", 0, 0, True)] * 2


def test_a_per_epoch_reading_starts_every_epoch_afresh(ahead_of):
    ahead, reading, made = ahead_of(per_epoch=True)
    assert list(ahead.epoch(0, 0, True)) == epoch_items(0)
    assert list(ahead.epoch(1, 0, True)) == epoch_items(1)
    assert reading.calls == [("cancel",), ("start", 0, 0, True), ("cancel",), ("start", 1, 0, True)]
    assert made == [(0, 0, True), (1, 0, True)]                      # the thread never ran ahead


def test_an_error_in_the_thread_is_raised_in_the_consumer(ahead_of):
    def failing(epoch, skip, augment):
        yield epoch, 0, augment
        raise ValueError("shard 3 is cut short")
    ahead = EpochsAhead(failing, FakeReading(False), depth=2, stats=LoaderStats())
    it = ahead.epoch(0, 0, True)
    assert next(it) == (0, 0, True)
    with pytest.raises(ValueError, match="shard 3 is cut short"):
        next(it)
    ahead.stop()
