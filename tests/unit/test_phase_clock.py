"""Phase timing on a GPU with CUDA events (issue 22, finding 12), run with fake events: a span's
duration is the device time between its events, resolved without blocking as events complete
and waited for only in ``reset``; the host clock stays the CPU's."""
import time

import torch

from hpctrain.ops.metrics import CudaClock, HostClock, StepTimer, clock_for


class FakeDevice:
    """A device clock the test advances: an event completes once the device reaches its time."""

    def __init__(self):
        self.now, self.queued_until, self.log = 0.0, 0.0, []

    def queue(self, ms):
        """Host queues ``ms`` of device work (returns at once, as a kernel launch does)."""
        self.queued_until = max(self.queued_until, self.now) + ms

    def event(self):
        dev = self

        class Event:
            def record(self):
                self.at = max(dev.queued_until, dev.now)    # completes after the work queued before it

            def query(self):
                return dev.now >= self.at

            def synchronize(self):
                if dev.now < self.at:       # the host would block here
                    dev.log.append("blocked")
                dev.now = max(dev.now, self.at)

            def elapsed_time(self, other):
                assert dev.now >= other.at, "elapsed_time before the event completed"
                return other.at - self.at
        return Event()


def test_device_spans_time_the_gpu_work_not_the_launches():
    dev = FakeDevice()
    timer = StepTimer(clock=CudaClock(event=dev.event))
    seen = []
    timer.sinks.append(lambda name, start, dur: seen.append((name, round(dur, 6))))
    with timer.span("forward"):
        dev.queue(30.0)                 # launches return at once; the device takes 30 ms
    with timer.span("backward"):
        dev.queue(50.0)
    assert seen == []                   # nothing completed yet, and nothing waited for
    dev.now = 35.0                      # the device finished forward
    with timer.span("allreduce"):
        dev.queue(20.0)
    assert seen == [("forward", 0.03)] and dev.log == []
    phases = timer.reset()              # waits for the rest
    assert {k: round(v, 6) for k, v in phases.items()} == {"forward": 0.03, "backward": 0.05, "allreduce": 0.02}
    assert dev.log and timer.reset() == {}


def test_host_clock_on_the_cpu():
    assert isinstance(clock_for(torch.device("cpu")), HostClock)
    timer = StepTimer()
    with timer.span("x"):
        time.sleep(0.001)
    assert timer.reset()["x"] > 0
