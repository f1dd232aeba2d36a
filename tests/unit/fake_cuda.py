"""A recording stand-in for the CUDA stream/event calls of :mod:`hpctrain.comm.streams`.

Install with ``monkeypatch.setattr(streams, "API", FakeCuda())`` before buckets or rings are
built: CPU tensors then take the CUDA code paths (side streams, events, waits), the copies and
kernels run on the CPU at once, and every stream/event call lands in ``log`` as a tuple, so a
test can assert the order: what waited on what, what the host blocked on, and when. Host reads
of device flags (``streams.host_read``, a host sync on a GPU) are logged as ``("host read",)``.
"""
import contextlib
import itertools


class FakeEvent:
    def __init__(self, api):
        self.api, self.name, self.stream = api, f"e{next(api.ids)}", None

    def record(self, stream=None):
        self.stream = stream if stream is not None else self.api.current
        self.api.log.append(("record", self.name, self.stream.name))

    def query(self):
        self.api.log.append(("query", self.name))
        return self.api.landed

    def synchronize(self):
        self.api.log.append(("event sync", self.name))


class FakeStream:
    def __init__(self, api, name):
        self.api, self.name = api, name

    def wait_stream(self, other):
        self.api.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event):
        self.api.log.append(("wait_event", self.name, event.name))

    def synchronize(self):
        self.api.log.append(("stream sync", self.name))


class FakeCuda:
    """Claims every device; one compute stream ("compute") and named side streams."""

    def __init__(self):
        self.log, self.ids = [], itertools.count()
        self.compute = FakeStream(self, "compute")
        self.current = self.compute
        self.n_streams = 0
        self.landed = True      # what an event query answers (False: the worst case, every wait blocks)

    def handles(self, device) -> bool:
        return True

    def Stream(self, device):
        self.n_streams += 1
        return FakeStream(self, f"side{self.n_streams}")

    def Event(self):
        return FakeEvent(self)

    def current_stream(self, device):
        return self.current

    @contextlib.contextmanager
    def stream(self, s):
        before, self.current = self.current, s
        self.log.append(("enter", s.name))
        try:
            yield
        finally:
            self.current = before
            self.log.append(("exit", s.name))

    def record_stream(self, t, s):
        self.log.append(("record_stream", s.name))

    def host_read(self, flag):
        """A device flag read on the host: on a GPU the host waits for the stream (counted)."""
        self.log.append(("host read",))
        return bool(flag)

    @property
    def host_reads(self) -> int:
        return len(self.named("host read"))

    @property
    def host_waits(self) -> int:
        """Everything that may block the host on a GPU: flag reads, event and stream syncs."""
        return sum(len(self.named(kind)) for kind in ("host read", "event sync", "stream sync"))

    def named(self, kind):
        return [e for e in self.log if e[0] == kind]
