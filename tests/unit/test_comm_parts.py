"""Serial tests of the communication layer's pure parts, against NumPy formulas."""
import numpy as np
import pytest
import torch

from hpctrain import comm as comm_lib
from hpctrain.tools.bench import allreduce
from hpctrain.comm.buckets import bucket_sizes, make_buckets
from hpctrain.comm.compression import FP16Compression, NoCompression, get
from hpctrain.comm.hierarchical import sum_into
from hpctrain.comm.progress import Pending, run
from hpctrain.comm.fused import nonfinite
from hpctrain.comm.ring import MPI_MAX_BYTES, SMALL_BYTES, chunk_bounds, mpi_choice
from hpctrain.comm.window import layout


@pytest.mark.parametrize("n_elems,n_parts", [(0, 3), (1, 4), (10, 3), (10007, 4), (8, 8)])
def test_chunk_bounds_cover_in_near_equal_parts(n_elems, n_parts):
    b = chunk_bounds(n_elems, n_parts)
    assert b[0] == 0 and b[-1] == n_elems and len(b) == n_parts + 1
    sizes = np.diff(b)
    assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1


def test_layout_aligns_every_block_to_a_cache_line():
    offsets, total = layout([(3, torch.float32), (0, torch.float32), (5, torch.float64)])
    assert offsets == [0, 64, 64] and total == 128


@pytest.mark.parametrize("n_srcs", [1, 2, 3, 4])
def test_sum_into_matches_numpy(n_srcs):
    rng = np.random.default_rng(n_srcs)
    srcs = [rng.standard_normal(1001).astype(np.float32) for _ in range(n_srcs)]
    out = torch.empty(1001)
    sum_into([torch.from_numpy(s) for s in srcs], out, scale=0.25, chunk=64)   # many chunks
    want = np.zeros(1001, np.float32)
    for s in srcs:
        want += s
    np.testing.assert_array_equal(out.numpy(), want * np.float32(0.25))


def test_nonfinite_sees_inf_nan_and_nothing_else():
    t = torch.arange(10, dtype=torch.float32)
    assert not nonfinite(t) and not nonfinite(t[:0])
    for bad in (float("inf"), float("-inf"), float("nan")):
        u = t.clone()
        u[3] = bad
        assert nonfinite(u) and nonfinite(u.half())


def test_fp16_codec_packs_like_numpy_and_adds_in_fp32():
    c, scale = FP16Compression(), 0.25
    x = torch.tensor([1.0, -3.0, 60000.0, 1e-3], dtype=torch.float32)
    y = torch.tensor([2.5, 7.0], dtype=torch.float32)
    wire = c.wire_buffer(6)
    c.pack([x, y], wire, scale)                # several gradients into one wire buffer
    want = (np.concatenate([x.numpy(), y.numpy()]) * scale).astype(np.float16)
    np.testing.assert_array_equal(wire.numpy(), want)
    recv = torch.from_numpy(np.array([1e-4, 2, 3, 4, 5, 60000], np.float16))
    dst = wire.clone()
    assert c.reduce(dst, recv, c.scratch(6), check=True) is False
    np.testing.assert_array_equal(   # one rounding of the fp32 sum, not an fp16 add
        dst.numpy(), (want.astype(np.float32) + recv.numpy().astype(np.float32)).astype(np.float16))
    big = torch.full((6,), 40000.0, dtype=torch.float16)
    assert c.reduce(big, big.clone(), c.scratch(6), check=True) is True   # 80000 > 65504
    out = [torch.empty(4), torch.empty(2)]
    c.unpack(wire, out)
    np.testing.assert_array_equal(torch.cat(out).numpy(), want.astype(np.float32))
    with pytest.raises(ValueError, match="float32"):
        c.check_dtype(torch.float64)


def test_none_codec_adds_in_place_and_checks_only_when_asked():
    c, x = NoCompression(), torch.tensor([2.0, 4.0])
    assert c.reduce(x, torch.tensor([1.0, float("inf")]), None, check=False) is False
    assert x[0] == 3.0
    assert c.reduce(x, torch.tensor([1.0, 1.0]), None, check=True) is True


def test_unknown_names_are_one_line_errors():
    with pytest.raises(ValueError, match="comm.compression.*fp16, none"):
        get("bf16")
    with pytest.raises(ValueError, match="comm.strategy.*flat, hierarchical"):
        comm_lib.create("ring", [], None)


def test_buckets_reverse_order_and_dtype_split():
    ps = [torch.nn.Parameter(torch.zeros(n, dtype=d)) for n, d in
          [(100, torch.float32), (100, torch.float32), (10, torch.float64), (300, torch.float32)]]
    buckets = make_buckets(ps, bucket_bytes=800)
    assert [[id(p) for p in b.params] for b in buckets] == [[id(ps[3])], [id(ps[2])],
                                                            [id(ps[1]), id(ps[0])]]
    assert bucket_sizes(ps, 800) == [(300, torch.float32), (10, torch.float64), (200, torch.float32)]
    assert all(b.result is b.out and b.out is not b.flat for b in buckets)


def test_pending_runs_a_generator_to_its_return_value():
    def algo(log):
        log.append(1)
        yield []                                # nothing to wait for: runs straight on
        log.append(2)
        return "done"
    log = []
    p = Pending(algo(log))
    assert p.done and p.value == "done" and log == [1, 2] and p.poll()
    assert run(algo([])) == "done"


def test_parse_size_and_bandwidths():
    assert allreduce.parse_size("4K") == 4096 and allreduce.parse_size("64MB") == 64 * 2**20
    with pytest.raises(Exception):
        allreduce.parse_size("3")
    algbw, busbw = allreduce.bandwidths(2 * 10**9, 2.0, 4)
    assert algbw == 1.0 and busbw == 1.5          # nccl-tests: busbw = algbw * 2(n-1)/n


@pytest.mark.parametrize("codec", ["none", "fp16"])
@pytest.mark.parametrize("strategy", sorted(comm_lib.STRATEGIES))
def test_one_rank_mean_is_the_gradient_exactly(strategy, codec):
    """On COMM_SELF nothing travels, so even fp16 returns the gradient bit for bit."""
    from mpi4py import MPI

    from hpctrain.topology import Topology
    topo = Topology.create(MPI.COMM_SELF)
    model = torch.nn.Sequential(torch.nn.Linear(30, 500), torch.nn.Tanh(), torch.nn.Linear(500, 40))
    sync = comm_lib.create(strategy, model.parameters(), topo, bucket_bytes=20_000,
                           compression=codec, overlap=True)
    torch.nn.functional.mse_loss(model(torch.randn(8, 30)), torch.zeros(8, 40)).backward()
    assert sync.started == list(range(len(sync.buckets))) and len(sync.buckets) > 2
    want = [p.grad.clone() for p in model.parameters()]
    assert sync.allreduce_grads() is False
    assert all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want))
    sync.close()
    topo.close()


def test_size_rule_picks_mpi_or_the_ring():
    none, fp16 = NoCompression(), FP16Compression()
    assert mpi_choice(4, none) == mpi_choice(SMALL_BYTES + 4, none) == "mpi"
    assert mpi_choice(MPI_MAX_BYTES, none) == "mpi"
    assert mpi_choice(MPI_MAX_BYTES + 4, none) == "ring"
    assert mpi_choice(4, fp16) == "ring"         # MPI cannot sum fp16


def test_scale_and_check_keeps_the_flag_on_the_device_when_asked():
    """issue 34, N6: ``keep`` returns a 0-d bool tensor beside the data (no host read there);
    any_flag combines a round's flags and reads them once."""
    from hpctrain.comm import streams
    from hpctrain.comm.fused import scale_and_check
    t = torch.ones(50_000)
    flag = scale_and_check(t, 0.5, keep=True)
    assert isinstance(flag, torch.Tensor) and flag.shape == () and flag.dtype == torch.bool
    assert not flag and torch.equal(t, torch.full_like(t, 0.5))
    t[7] = float("nan")
    bad = scale_and_check(t, keep=True)
    assert bool(bad) and scale_and_check(t) is True
    assert streams.any_flag([False, flag, bad]) is True and streams.any_flag([False, flag]) is False
    assert streams.any_flag([True, flag]) is True and streams.any_flag([]) is False
