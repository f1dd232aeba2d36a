"""Wire floors and speed-up bounds of the emulated links, worked by hand."""
import pytest

from hpctrain.tools.cluster.compare import FRAME_OVERHEAD, compare, format_comparison, node_wire_bytes, wire_floor_s

MiB = 2**20


def test_node_wire_bytes_by_hand():
    # 2 nodes × 2 ranks, 64 MiB: the world ring leaves a node over one edge carrying 2·3/4·S;
    # hierarchical: 2 local ranks × (2·1/2 · S/2) = S
    assert node_wire_bytes("flat", 64 * MiB, 2, 2) == 96 * MiB
    assert node_wire_bytes("mpi4py", 64 * MiB, 2, 2) == 96 * MiB
    assert node_wire_bytes("hierarchical", 64 * MiB, 2, 2) == 64 * MiB
    assert node_wire_bytes("hierarchical", 8 * MiB, 4, 2) == 12 * MiB          # 2·3/4·S
    assert node_wire_bytes("flat", 8 * MiB, 1, 4) == 0                         # one node: no link


def test_wire_floor_seconds():
    t = wire_floor_s("flat", "none", 64 * MiB, 2, 2, 1e9)
    assert t == pytest.approx(96 * MiB * 8 / 1e9 * FRAME_OVERHEAD)
    assert t == pytest.approx(0.842, abs=1e-3)
    assert wire_floor_s("flat", "fp16", 64 * MiB, 2, 2, 1e9) == pytest.approx(t / 2)
    assert wire_floor_s("flat", "none", 64 * MiB, 2, 2, 0) == 0                 # unshaped


def _row(impl, comp, t, n_bytes=64 * MiB):
    return {"impl": impl, "compression": comp, "ranks_per_node": 2, "world_size": 4, "bytes": n_bytes,
            "time_s": t}


def test_compare_speedups_bounds_and_targets():
    rows = [_row("mpi4py", "none", 1.0), _row("flat", "none", 1.0), _row("flat", "fp16", 0.5),
            _row("hierarchical", "none", 0.8), _row("hierarchical", "fp16", 0.5)]
    res = {r["comparison"]: r for r in compare(rows, n_nodes=2, rate_bit_s=1e9)}
    assert res["hierarchical vs flat, fp32"]["speedup"] == pytest.approx(1.25)
    assert res["hierarchical vs flat, fp32"]["wire_bound"] == pytest.approx(1.5)     # (3/4) / (1/2)
    assert res["fp16 vs fp32, flat"]["speedup"] == pytest.approx(2.0)
    assert res["fp16 vs fp32, flat"]["wire_bound"] == pytest.approx(2.0)
    assert res["fp16 vs fp32, hierarchical"]["speedup"] == pytest.approx(1.6)
    assert res["fp16 vs fp32, hierarchical"]["target"] == 1.7
    table = format_comparison(list(res.values()))
    assert "1.25x" in table and "below" in table and " ok " in table


def test_compare_skips_missing_pairs():
    assert compare([_row("flat", "none", 1.0)], 2, 1e9) == []
