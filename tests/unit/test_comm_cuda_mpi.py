"""Serial tests of the device seam's pure parts (hpctrain.comm.staging, hpctrain.comm.cuda_mpi):
page ranges, host registration with a fake CUDA runtime, the CUDA-aware query and its switch,
the routing rule, the copy-event hand-off through progress.Pending, and fp16 packing on the
"device" (a CPU stand-in) against the unstaged host pack. No GPU: the CUDA calls are faked."""
import ctypes

import pytest
import torch

from hpctrain import kernels
from hpctrain import comm as comm_lib
from hpctrain.comm import cuda_mpi, ring, staging
from hpctrain.comm.compression import FP16Compression
from hpctrain.comm.progress import Pending
from hpctrain.comm.wire import Wire

PAGE = cuda_mpi.PAGE_BYTES


class FakeCudart:
    """Records cudaHostRegister/Unregister; refuses a second registration of a page, as CUDA does."""

    def __init__(self, fail_with=0):
        self.log, self.live, self.fail_with = [], {}, fail_with

    def cudaHostRegister(self, ptr, n_bytes, flags):
        self.log.append(("register", ptr, n_bytes, flags))
        if self.fail_with:
            return self.fail_with
        pages = set(range(ptr // PAGE, (ptr + n_bytes) // PAGE))
        assert ptr % PAGE == 0 and n_bytes % PAGE == 0
        assert not any(pages & p for p in self.live.values()), "page registered twice"
        self.live[ptr] = pages
        return 0

    def cudaHostUnregister(self, ptr):
        self.log.append(("unregister", ptr))
        return 0 if self.live.pop(ptr, None) is not None else 712  # not registered


def test_page_ranges_round_to_pages_and_merge_shared_pages():
    assert cuda_mpi.page_ranges([]) == []
    assert cuda_mpi.page_ranges([(5 * PAGE + 10, 0)]) == []
    assert cuda_mpi.page_ranges([(5 * PAGE + 10, 20)]) == [(5 * PAGE, PAGE)]
    # two buffers sharing page 6, a third on its own further on, given out of order
    spans = [(9 * PAGE + 1, PAGE), (5 * PAGE + 64, PAGE + 64), (6 * PAGE + 128, PAGE)]
    assert cuda_mpi.page_ranges(spans) == [(5 * PAGE, 3 * PAGE), (9 * PAGE, 2 * PAGE)]
    # touching ranges merge too (one registration)
    assert cuda_mpi.page_ranges([(0, PAGE), (PAGE, PAGE)]) == [(0, 2 * PAGE)]


def test_registry_pairs_register_with_unregister():
    fake = FakeCudart()
    reg = cuda_mpi.HostRegistry(fake)
    mem = torch.zeros(3 * PAGE, dtype=torch.uint8)
    a, b = mem[100:PAGE + 100], mem[PAGE + 200:2 * PAGE]       # share a page: registered once
    reg.register([a, b, torch.empty(0)])
    assert [e[0] for e in fake.log] == ["register"]
    (_, ptr, n_bytes, flags), = fake.log
    assert ptr <= a.data_ptr() and b.data_ptr() + b.numel() <= ptr + n_bytes and flags == 0
    reg.close()
    reg.close()                                                   # idempotent
    assert fake.log[1:] == [("unregister", ptr)] and not fake.live and not reg.ranges


def test_registry_without_cuda_does_nothing_and_reports_cuda_errors():
    reg = cuda_mpi.HostRegistry(None)
    reg.register([torch.zeros(10)])
    reg.close()
    assert reg.ranges == []
    with pytest.raises(RuntimeError, match="cudaHostRegister failed: CUDA error 712"):
        cuda_mpi.HostRegistry(FakeCudart(fail_with=712)).register([torch.zeros(10)])


def test_registry_is_a_noop_on_this_machine():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    assert cuda_mpi.cudart() is None


@pytest.mark.parametrize("value,want", [("", None), ("0", False), ("1", True), (" 1 ", True)])
def test_override_switch(value, want):
    assert cuda_mpi.override({cuda_mpi.AWARE_SWITCH: value}) is want
    assert cuda_mpi.override({}) is None


def test_override_switch_rejects_other_values():
    with pytest.raises(ValueError, match="HPCTRAIN_CUDA_AWARE_MPI='yes'"):
        cuda_mpi.override({cuda_mpi.AWARE_SWITCH: "yes"})


class OpenMPILike:
    def __init__(self, answer):
        self.MPIX_Query_cuda_support = lambda: answer


class MPICHLike:
    def __init__(self, answer, err=0):
        def query(kind, out):
            assert kind.value == cuda_mpi.MPIX_GPU_SUPPORT_CUDA
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = answer
            return err
        self.MPIX_GPU_query_support = query


@pytest.mark.parametrize("lib,want", [(OpenMPILike(1), True), (OpenMPILike(0), False),
                                      (MPICHLike(1), True), (MPICHLike(0), False),
                                      (MPICHLike(1, err=1), False), (object(), False)])
def test_query_library(lib, want):
    aware, how = cuda_mpi.query_library(lib)
    assert aware is want and how


def test_cuda_aware_switch_wins_and_this_machine_is_not_cuda_aware():
    assert cuda_mpi.cuda_aware({cuda_mpi.AWARE_SWITCH: "1"}) == (True, "HPCTRAIN_CUDA_AWARE_MPI=1")
    assert cuda_mpi.cuda_aware({cuda_mpi.AWARE_SWITCH: "0"})[0] is False
    aware, how = cuda_mpi.cuda_aware({})     # Debian's Open MPI 4.1.4: built without CUDA
    assert aware is False and "MPIX_Query_cuda_support() = 0" in how


class BothQueries(MPICHLike):
    """MPICH >= 4.1: the Open MPI-style query as well as its own."""

    def __init__(self, answer):
        super().__init__(answer)
        self.MPIX_Query_cuda_support = lambda: 1


@pytest.mark.parametrize("lib,version,want", [
    (OpenMPILike(1), "Open MPI v5.0.3, package: Open MPI", False),   # libnbc: host reductions
    (BothQueries(1), "Open MPI v5.0.3", False),                     # never Open MPI, whatever it has
    (MPICHLike(1), "MPICH Version:\t4.2.0", True),
    (BothQueries(0), "MPICH Version:\t4.2.0", False),               # asks the GPU query, not the other
    (OpenMPILike(1), "MVAPICH2 Version 2.3.7", False),              # no MPIX_GPU_query_support
    (object(), "MPICH Version:\t3.4", False)])
def test_query_nonblocking(lib, version, want):
    ok, how = cuda_mpi.query_nonblocking(lib, version)
    assert ok is want and how


def test_nonblocking_switch_wins_and_needs_a_cuda_aware_library():
    env = {cuda_mpi.NBC_SWITCH: "1"}
    assert cuda_mpi.nonblocking_device_ok(env) == (True, "HPCTRAIN_CUDA_AWARE_NBC=1")
    assert cuda_mpi.nonblocking_device_ok({cuda_mpi.NBC_SWITCH: "0", cuda_mpi.AWARE_SWITCH: "1"})[0] is False
    ok, how = cuda_mpi.nonblocking_device_ok({})       # this machine: not CUDA-aware at all
    assert ok is False and "not CUDA-aware" in how
    # CUDA-aware Open MPI (forced here): still no device buffers in Iallreduce
    ok, how = cuda_mpi.nonblocking_device_ok({cuda_mpi.AWARE_SWITCH: "1"})
    assert ok is False and "Open MPI" in how
    with pytest.raises(ValueError, match="HPCTRAIN_CUDA_AWARE_NBC='on'"):
        cuda_mpi.nonblocking_device_ok({cuda_mpi.NBC_SWITCH: "on"})


def test_device_buffers_never_reach_a_nonblocking_collective_unless_allowed(monkeypatch):
    """The route of a bucket MPI sums: blocking Allreduce in a blocking round; otherwise
    Iallreduce only where MPI's non-blocking collectives take the memory, else the ring."""
    assert ring.mpi_route(blocking=True, nbc_ok=False) == "Allreduce"
    assert ring.mpi_route(blocking=True, nbc_ok=True) == "Allreduce"
    assert ring.mpi_route(blocking=False, nbc_ok=True) == "Iallreduce"
    assert ring.mpi_route(blocking=False, nbc_ok=False) == "ring"
    monkeypatch.delenv(cuda_mpi.NBC_SWITCH, raising=False)
    monkeypatch.setenv(cuda_mpi.AWARE_SWITCH, "1")       # a CUDA-aware Open MPI
    assert ring.nonblocking_mpi_ok("cpu")                 # host memory: NumPy views
    assert not ring.nonblocking_mpi_ok(torch.device("cuda", 0))
    # a device bucket of MPI's keeps ring buffers for its non-blocking rounds
    none = comm_lib.compression.get("none")
    monkeypatch.setattr(ring, "AS_TENSOR", frozenset({"cpu", "cuda"}))  # CPU tensors stand in
    buf = ring.RingBuffers(1000, torch.float32, 2, none, "mpi", "cpu")
    assert buf.method == "mpi" and not buf.nbc_ok and buf.recv.numel() == 500
    monkeypatch.setenv(cuda_mpi.NBC_SWITCH, "1")
    buf = ring.RingBuffers(1000, torch.float32, 2, none, "mpi", "cpu")
    assert buf.nbc_ok and buf.recv.numel() == 0


def test_route():
    assert staging.route("cpu", forced=False, direct=True) == "host"
    assert staging.route("cpu", forced=True, direct=False) == "staged"
    assert staging.route("cpu", forced=True, direct=True) == "direct"
    assert staging.route("cuda", forced=False, direct=False) == "staged"
    assert staging.route("cuda", forced=False, direct=True) == "direct"


def test_cuda_buckets_stay_staged_until_the_ring_takes_device_buffers(monkeypatch):
    monkeypatch.setenv(cuda_mpi.AWARE_SWITCH, "1")
    assert staging.mpi_takes_device_buffers(torch.device("cpu"))
    assert staging.mpi_takes_device_buffers(torch.device("cuda", 0)) is staging.DEVICE_HANDOFF
    monkeypatch.setenv(cuda_mpi.AWARE_SWITCH, "0")
    assert not staging.mpi_takes_device_buffers(torch.device("cpu"))


class SlowReady:
    """A copy that completes after ``n`` tests; records every call."""

    def __init__(self, n):
        self.n, self.log = n, []

    def test(self):
        self.log.append("test")
        return self.log.count("test") > self.n

    def wait(self):
        self.log.append("wait")
        self.n = 0


def reduction(log):
    log.append("reduce")
    return 42
    yield   # a generator


def test_pending_polls_a_copy_event_without_waiting_on_it():
    ready, log = SlowReady(4), []
    p = Pending(staging.after(ready, reduction(log)))   # tests 1 (after), 2 (Pending): not yet
    assert not p.done and log == []
    assert p.poll() is False and p.poll() is False     # tests 3, 4: not yet
    assert p.poll() is True and log == ["reduce"] and p.value == 42
    assert "wait" not in ready.log


def test_blocking_path_waits_on_the_copy_event_and_gives_the_same():
    ready, log = SlowReady(3), []
    assert Pending(staging.after(ready, reduction(log))).wait() == 42
    assert "wait" in ready.log and log == ["reduce"]
    ready, log = SlowReady(3), []
    p = Pending(staging.after(ready, reduction(log), wait=True))  # a blocking round: at the start
    assert p.done and p.value == 42 and ready.log == ["wait"]


def test_cpu_stand_in_copy_is_complete_at_once():
    st = staging.Staging(10, torch.float32, "cpu")
    assert st.to_host(st.dev[0], torch.empty(10)) is staging.DONE and staging.DONE.test()


def test_fp16_packed_on_the_device_equals_the_unstaged_host_pack():
    """The staged bucket packs one flat device buffer, the unstaged one the gradients
    themselves: the same kernel, element-wise the same rounding (fp32 multiply, then
    round-to-nearest-even to fp16, inf past 65504), so the same bytes."""
    codec = FP16Compression()
    g = torch.randn(70001) * 3
    g[:6] = torch.tensor([65519.0, 65520.0, 6e-8, 2.0**-25, -1e-3, float("nan")]) * 4  # edges
    sizes, scale = [3, 40000, 29998], 0.25
    grads = list(torch.split(g, sizes))
    unstaged = codec.wire_buffer(g.numel())
    codec.pack(grads, unstaged, scale)
    st = staging.Staging(g.numel(), torch.float32, "cpu")
    st.dev[0].copy_(g)
    wire = Wire(codec, codec.wire_buffer(g.numel()), whole=True)
    wire.stage(st)
    host_wire = wire.buf
    host_flat = torch.full((g.numel(),), float("nan"))
    st.to_host(st.dev[0], host_flat, wire, scale)
    assert torch.equal(host_wire.view(torch.int16), unstaged.view(torch.int16))
    assert torch.equal(host_wire.view(torch.int16), (g * scale).half().view(torch.int16))
    assert torch.isnan(host_flat).all(), "only the fp16 wire crosses"
    flag = kernels.pack_fp16(grads, torch.empty_like(unstaged), scale)
    assert bool(flag)               # the NaN above
    # the mean comes back as fp16 and is unpacked on the device, as the host path would
    out_dev, out_host = torch.empty(g.numel()), torch.empty(g.numel())
    assert st.to_device(host_flat, out_dev, wire) is out_dev
    codec.unpack(unstaged, [out_host])
    assert torch.equal(out_dev.view(torch.int32), out_host.view(torch.int32))
