"""The host staging path of device buckets (hpctrain.comm.staging), run on CPU stand-ins.

``HPCTRAIN_TEST_STAGING=1`` (set before the sync is created: it is read when the buckets are
made) makes CPU buckets take the path of device buckets: gradients live in separate "device"
buffers, are copied (or, fp16, packed on the "device" and the fp16 wire copied) to the host
buffers MPI reduces, and the mean is copied back. Only the CUDA calls themselves are left to the
GPU suite (tests/mpi/test_gpu_sync.py); none of this has run on a GPU.

Every strategy x compression x topology, overlap on and off, through a real backward (so the
overlap hooks fire and ``p.grad`` views are reused across rounds): the staged sync gives the
bytes of the unstaged one (bit-identical: the same reduction runs on the same host bytes; fp16
is packed by the same kernel, element-wise the same rounding, from the "device" buffer), and
both equal MPI's Allreduce mean within the bounds of test_comm_strategies.py. Also: only fp16
crosses for a compressed bucket; copies whose event completes late (polled while overlapped,
waited in bucket order in a blocking round); registration of host memory with a fake CUDA
runtime, unregistered before the window is freed; the direct route of a CUDA-aware MPI.
"""
import zlib

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpctrain import comm as comm_lib
from hpctrain.ops import testhooks
from hpctrain.comm import ring, staging
from hpctrain.comm.compression import FP16Compression
from hpctrain.topology import Topology
from tests.mpi.test_comm_strategies import CASES, CODECS, STRATS, bound, reference

STAGING_CASES = ("several", "big", "byte_over", "empty")


def make(strategy, codec, topo, sizes, bucket_bytes, overlap, staged, monkeypatch, closer):
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    with monkeypatch.context() as m:
        if staged:
            m.setenv(testhooks.TEST_STAGING, "1")
        else:
            m.delenv(testhooks.TEST_STAGING, raising=False)
        sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=bucket_bytes, compression=codec,
                                      overlap=overlap))
    assert all((b.staging is not None) == staged for b in sync.buckets)
    return params, sync


def rounds(params, sync, comm, seed, n_rounds=3):
    """Backward of sum(p * c) (so p.grad = c) then a sync, ``n_rounds`` times; the gradients
    are zeroed in place between rounds (the views survive). Returns [(grads, means)]."""
    rng = np.random.default_rng(seed * 1000 + comm.Get_rank())
    out = []
    for _ in range(n_rounds):
        coefs = [torch.from_numpy(rng.standard_normal(p.numel()) * 3).float() for p in params]
        for p in params:
            if p.grad is not None:
                p.grad.zero_()
        loss = sum((p * c).sum() for p, c in zip(params, coefs))
        loss.backward()
        assert sync.finish(scatter=True) is False
        out.append((coefs, [p.grad.clone() for p in params]))
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("ranks_per_node", [0, 1])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_staged_equals_unstaged_and_mpi(strategy, codec, ranks_per_node, overlap, monkeypatch, closer):
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm, ranks_per_node=ranks_per_node))
    for case in STAGING_CASES:
        sizes, bucket_bytes = CASES[case]
        results = {}
        for staged in (False, True):
            params, sync = make(strategy, codec, topo, sizes, bucket_bytes, overlap, staged, monkeypatch, closer)
            results[staged] = rounds(params, sync, comm, seed=len(sizes))
            for b in sync.buckets:     # p.grad are views of the bucket's home: device side if staged
                home = b.staging.dev if staged else b.bufs
                for p, v in zip(b.params, b.views[1 - b.k]):
                    assert p.grad is v
                    assert v.untyped_storage().data_ptr() == home[1 - b.k].untyped_storage().data_ptr()
            if staged and sync.buckets:
                assert "staged from cpu" in sync.describe()
        for (coefs, plain), (_, staged_means) in zip(results[False], results[True]):
            for a, b in zip(plain, staged_means):
                assert torch.equal(a, b), (strategy, codec, case, "staged differs from unstaged")
            for g, (want, mean_abs) in zip(staged_means, reference(coefs, comm)):
                err = np.abs(g.double().numpy() - want)
                tol = bound(codec, torch.float32, comm.Get_size(), mean_abs)
                assert np.all(err <= tol), (strategy, codec, case, float((err - tol).max()))
            blob = b"".join(g.numpy().tobytes() for g in staged_means)
            assert len(set(comm.allgather(zlib.crc32(blob)))) == 1, "ranks disagree"


@pytest.mark.mpi
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_staged_mean_readable_without_scatter(strategy, codec, monkeypatch, closer):
    """``finish(scatter=False)`` leaves p.grad (on the device side) alone; ``result`` is the
    device-side mean, copied back once; ``scatter_means`` binds the views to it."""
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    topo = closer(Topology.create(comm, ranks_per_node=1))
    params, sync = make(strategy, codec, topo, [5, 30000, 7], 128 * 1024, False, True, monkeypatch, closer)
    for p in params:
        p.grad = torch.full_like(p, float(comm.Get_rank()))
    sync.begin()
    assert sync.finish(scatter=False) is False
    for p in params:
        assert torch.all(p.grad == comm.Get_rank())
    tol = 0 if codec == "none" else n * 2.0**-11
    for b in sync.buckets:
        res = b.result
        assert res is b.staging.dev[1 - b.k] and b.result is res
        assert torch.allclose(res, torch.tensor((n - 1) / 2), rtol=tol, atol=0)
    sync.scatter_means()
    for p in params:
        assert torch.allclose(p.grad, torch.tensor((n - 1) / 2), rtol=tol, atol=0)


def test_cpu_buckets_are_not_staged_without_the_switch(monkeypatch):
    from hpctrain.comm.buckets import make_buckets
    monkeypatch.delenv(testhooks.TEST_STAGING, raising=False)
    ps = [torch.nn.Parameter(torch.zeros(10)) for _ in range(3)]
    assert all(b.staging is None for b in make_buckets(ps, bucket_bytes=80))
    monkeypatch.setenv(testhooks.TEST_STAGING, "1")
    buckets = make_buckets(ps, bucket_bytes=80)
    assert buckets and all(b.staging is not None for b in buckets)
    for b in buckets:
        for p, v in zip(b.params, b.views[0]):
            assert v.untyped_storage().data_ptr() == b.staging.dev[0].untyped_storage().data_ptr()


def run_compare(strategy, codec, topo, overlap, monkeypatch, closer, case="several", env=None, check=None):
    """Rounds through the unstaged and the staged sync (``env`` set while the staged one is made);
    the staged means must equal the unstaged bytes and MPI's Allreduce mean within bounds.
    ``check(sync)`` runs after the staged rounds. Returns the staged sync."""
    comm = topo.comm
    sizes, bucket_bytes = CASES[case]
    params, plain_sync = make(strategy, codec, topo, sizes, bucket_bytes, overlap, False, monkeypatch, closer)
    plain = rounds(params, plain_sync, comm, seed=5)
    with monkeypatch.context() as m:
        for k, v in (env or {}).items():
            m.setenv(k, v)
        params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
        m.setenv(testhooks.TEST_STAGING, "1")
        sync = closer(comm_lib.create(strategy, params, topo, bucket_bytes=bucket_bytes, compression=codec,
                                      overlap=overlap))
    staged = rounds(params, sync, comm, seed=5)
    if check is not None:
        check(sync)
    for (coefs, want), (_, got) in zip(plain, staged):
        for a, b in zip(want, got):
            assert torch.equal(a, b), (strategy, codec, "differs from unstaged")
        for g, (mean, mean_abs) in zip(got, reference(coefs, comm)):
            err = np.abs(g.double().numpy() - mean)
            assert np.all(err <= bound(codec, torch.float32, comm.Get_size(), mean_abs))
    return sync


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [False, True])
def test_fp16_crosses_as_fp16_packed_on_the_device(overlap, monkeypatch, closer):
    """A compressed staged bucket packs on the "device" into its device wire and copies only
    that: the host fp32 buffers are never written (a NaN sentinel survives every round)."""
    comm = MPI.COMM_WORLD
    topo = closer(Topology.create(comm))
    packed = []
    real_pack = FP16Compression.pack

    def spy(self, tensors, wire, scale=1.0):
        packed.append((tuple(t.data_ptr() for t in tensors), wire.data_ptr()))
        return real_pack(self, tensors, wire, scale)

    monkeypatch.setattr(FP16Compression, "pack", spy)
    sizes, bucket_bytes = CASES["big"]
    params, sync = make("flat", "fp16", topo, sizes, bucket_bytes, overlap, True, monkeypatch, closer)
    compressed = [b for b in sync.buckets if b.packed is not None]
    assert len(compressed) == (comm.Get_size() > 1)
    for b in compressed:
        for buf in b.bufs:
            buf.fill_(float("nan"))
    results = rounds(params, sync, comm, seed=3)
    for b in compressed:
        assert b.staging.dev_wire.dtype == torch.float16 and b.staging.dev_wire.numel() == b.n_elems
        assert all(torch.isnan(buf).all() for buf in b.bufs), "fp32 crossed to the host"
        devs = {d.data_ptr() for d in b.staging.dev}
        assert packed and all(srcs[0] in devs and wire == b.staging.dev_wire.data_ptr()
                              for srcs, wire in packed)
    for coefs, got in results:
        for g, (mean, mean_abs) in zip(got, reference(coefs, comm)):
            assert np.all(np.abs(g.double().numpy() - mean) <= bound("fp16", torch.float32, comm.Get_size(), mean_abs))


class LateCopy(staging.Ready):
    """A device-to-host copy whose event completes after ``n`` tests (a slow PCIe link)."""

    log = []

    def __init__(self, n=3):
        super().__init__()
        self.n = n

    def test(self):
        LateCopy.log.append("test")
        self.n -= 1
        return self.n < 0

    def wait(self):
        LateCopy.log.append("wait")
        self.n = -1


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_reduction_waits_for_the_copy_event(strategy, codec, overlap, monkeypatch, closer):
    """The reduction starts only once its copy completed: overlapped, hooks and polls test the
    event (never wait on it) until it is done; a blocking round waits at the start of each
    bucket. Either way the bytes equal the unstaged path's."""
    real = staging.Staging.to_host

    def late(self, *args, **kwargs):
        real(self, *args, **kwargs)
        return LateCopy()

    monkeypatch.setattr(staging.Staging, "to_host", late)
    LateCopy.log = []
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=1))
    run_compare(strategy, codec, topo, overlap, monkeypatch, closer)
    assert LateCopy.log
    if overlap:
        assert "test" in LateCopy.log       # polled; finish() may wait for the last ones
    else:                                   # finish() starts a blocking round: waits, in order
        assert set(LateCopy.log) == {"wait"}


class FakeCudart:
    log = []

    def cudaHostRegister(self, ptr, n_bytes, flags):
        FakeCudart.log.append(("register", ptr, n_bytes))
        return 0

    def cudaHostUnregister(self, ptr):
        FakeCudart.log.append(("unregister", ptr))
        return 0


@pytest.mark.mpi
@pytest.mark.parametrize("strategy", STRATS)
def test_host_memory_registered_once_and_unregistered_before_it_is_freed(strategy, monkeypatch, closer):
    from hpctrain.comm import cuda_mpi
    from hpctrain.comm.window import SharedWindow
    FakeCudart.log = []
    monkeypatch.setattr(cuda_mpi, "cudart", lambda: FakeCudart())
    real_free = SharedWindow.free

    def free(self):
        FakeCudart.log.append(("free window",))
        real_free(self)

    monkeypatch.setattr(SharedWindow, "free", free)
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=2))
    sync = run_compare(strategy, "none", topo, False, monkeypatch, closer)
    registered = [e for e in FakeCudart.log if e[0] == "register"]
    assert registered and "registered host memory" in sync.describe()
    for b in sync.buckets:         # every host buffer MPI reads lies in a registered range
        for buf in b.bufs:
            if buf.numel():
                assert any(p <= buf.data_ptr() and buf.data_ptr() + buf.numel() * 4 <= p + n
                           for _, p, n in registered)
    n_before = len(FakeCudart.log)
    sync.close()
    after = FakeCudart.log[n_before:]
    assert sorted(e[1] for e in after if e[0] == "unregister") == sorted(p for _, p, _ in registered)
    if strategy == "hierarchical":
        assert after[-1] == ("free window",), after
    assert not any(e[0] == "register" for e in after)


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["switch", "decision", "tensors"])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("strategy", STRATS)
def test_cuda_aware_mpi_takes_device_buffers_directly(strategy, codec, how, monkeypatch, closer):
    """Where MPI is CUDA-aware (the switch, or the decision monkeypatched) a full-precision
    ``flat`` bucket hands its "device" buffers to MPI as they are: no staging, no copies.
    fp16 and ``hierarchical`` (the window) stay staged. Same bytes either way. ``tensors``: the
    buffers go to MPI as the tensors themselves (DLPack), the hand-off a CUDA bucket takes."""
    env = {}
    if how in ("switch", "tensors"):
        env = {"HPCTRAIN_CUDA_AWARE_MPI": "1"}
    handed = []                 # what the ring gave MPI, where "tensors" checks it
    if how == "tensors":
        monkeypatch.setattr(ring, "AS_TENSOR", frozenset({"cpu", "cuda"}))
        arr, msg = ring._arr, ring._msg
        monkeypatch.setattr(ring, "_arr", lambda t: handed.append(type(arr(t))) or arr(t))
        monkeypatch.setattr(ring, "_msg", lambda t: handed.append(type(msg(t)[0])) or msg(t))
    else:
        monkeypatch.setattr(staging, "mpi_takes_device_buffers", lambda device: True)

    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=1))

    def check(sync):        # no Staging: nothing is ever copied (auto may pick either strategy)
        direct = sync.name == "flat" and codec == "none"
        assert all((b.staging is None) == direct for b in sync.buckets), (sync.name, codec)
        if direct:
            assert "staged" not in sync.describe()

    for case in ("several", "big"):
        run_compare(strategy, codec, topo, True, monkeypatch, closer, case=case, env=env, check=check)
    if how == "tensors" and strategy == "flat" and codec == "none" and topo.comm.Get_size() > 1:
        assert handed and set(handed) == {torch.Tensor}, set(handed)


@pytest.mark.mpi
@pytest.mark.parametrize("nbc", ["0", "1"])
@pytest.mark.parametrize("overlap", [False, True])
def test_device_buffers_reach_iallreduce_only_where_allowed(overlap, nbc, monkeypatch, closer):
    """Direct route, buffers handed over as tensors (CPU tensors standing in for device memory):
    MPI's collectives get them only in blocking rounds (``Allreduce``) or where the non-blocking
    collectives are allowed device memory (``HPCTRAIN_CUDA_AWARE_NBC=1``); otherwise the
    non-blocking rounds of MPI's buckets run the ring (Isend/Irecv). The means stay within the
    bounds of MPI's Allreduce mean either way."""
    monkeypatch.setattr(ring, "AS_TENSOR", frozenset({"cpu", "cuda"}))
    collective, p2p = [], []
    arr, msg = ring._arr, ring._msg
    monkeypatch.setattr(ring, "_arr", lambda t: collective.append(type(arr(t))) or arr(t))
    monkeypatch.setattr(ring, "_msg", lambda t: p2p.append(type(msg(t)[0])) or msg(t))
    monkeypatch.setenv(ring.cuda_mpi.NBC_SWITCH, nbc)
    topo = closer(Topology.create(MPI.COMM_WORLD, ranks_per_node=1))
    comm = topo.comm
    sizes, bucket_bytes = CASES["several"]
    with monkeypatch.context() as m:
        m.setenv("HPCTRAIN_CUDA_AWARE_MPI", "1")
        m.setenv(testhooks.TEST_STAGING, "1")
        params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
        sync = closer(comm_lib.create("flat", params, topo, bucket_bytes=bucket_bytes, overlap=overlap))
    assert all(b.staging is None for b in sync.buckets)
    methods = sync._methods()
    collective.clear(), p2p.clear()
    for coefs, got in rounds(params, sync, comm, seed=11):
        for g, (mean, mean_abs) in zip(got, reference(coefs, comm)):
            err = np.abs(g.double().numpy() - mean)
            assert np.all(err <= bound("none", torch.float32, comm.Get_size(), mean_abs))
    if comm.Get_size() == 1:
        return
    if overlap and nbc == "0":      # non-blocking rounds: no tensor ever reaches a collective
        assert collective == [] and p2p and set(p2p) == {torch.Tensor}
        assert "mpi" not in methods     # the choice says so too (nothing for MPI to measure)
    else:
        assert "mpi" in methods                           # Allreduce (blocking round) or the allowed Iallreduce
        assert collective and set(collective) == {torch.Tensor}


@pytest.mark.mpi
def test_this_machine_stages_by_default(monkeypatch, closer):
    from hpctrain.comm import cuda_mpi
    monkeypatch.delenv(cuda_mpi.AWARE_SWITCH, raising=False)
    assert cuda_mpi.cuda_aware() == (False, "MPIX_Query_cuda_support() = 0")
    topo = closer(Topology.create(MPI.COMM_WORLD))
    _, sync = make("flat", "none", topo, [10, 20], 4096, False, True, monkeypatch, closer)
    assert all(b.staging is not None for b in sync.buckets)
