"""Allreduce cost formulas against hand-computed values (Thakur, Rabenseifner & Gropp 2005)."""
import math

import pytest

from hpctrain.tools.sim.costs import (Link, allreduce_s, flat_s, halving_doubling_s, hierarchical_s,
                                recursive_doubling_s, ring_s)

A, B, G = 1e-6, 1e-9, 1e-10      # α [s], β [s/B], γ [s/B]
LINK = Link(A, B, G)
N = 1e6                          # bytes


def test_two_ranks_by_hand():
    # ring: 2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ = 2e-6 + 1e-3 + 5e-5
    assert ring_s(2, N, LINK) == pytest.approx(1.052e-3, rel=1e-12)
    # recursive doubling: one exchange of the whole vector, reduced: 1e-6 + 1e-3 + 1e-4
    assert recursive_doubling_s(2, N, LINK) == pytest.approx(1.101e-3, rel=1e-12)
    # halving-doubling at p = 2 is the ring
    assert halving_doubling_s(2, N, LINK) == pytest.approx(ring_s(2, N, LINK), rel=1e-12)


def test_ring_vs_recursive_doubling_crossover():
    # small messages: latency wins, recursive doubling (log2 p α) beats ring (2(p−1)α)
    assert recursive_doubling_s(64, 8, LINK) < ring_s(64, 8, LINK)
    # large messages: the ring moves 2(p−1)/p·n, recursive doubling log2(p)·n
    assert ring_s(64, 64e6, LINK) < recursive_doubling_s(64, 64e6, LINK)


def test_eight_ranks_by_hand():
    # ring: 14α + 1.75nβ + 0.875nγ; rhd: 6α + same bandwidth terms; rd: 3(α + nβ + nγ)
    assert ring_s(8, N, LINK) == pytest.approx(14e-6 + 1.75e-3 + 0.875e-4, rel=1e-12)
    assert halving_doubling_s(8, N, LINK) == pytest.approx(6e-6 + 1.75e-3 + 0.875e-4, rel=1e-12)
    assert recursive_doubling_s(8, N, LINK) == pytest.approx(3 * (1e-6 + 1e-3 + 1e-4), rel=1e-12)


def test_non_power_of_two_folds_extra_ranks():
    # p = 6: p' = 4 (2 steps), plus fold-in (α + nβ + nγ) and fold-out (α + nβ)
    step = A + N * (B + G)
    assert recursive_doubling_s(6, N, LINK) == pytest.approx(2 * step + step + (A + N * B), rel=1e-12)
    body = 4 * A + 2 * 0.75 * N * B + 0.75 * N * G
    assert halving_doubling_s(6, N, LINK) == pytest.approx(body + step + (A + N * B), rel=1e-12)


def test_hierarchical_term_by_hand():
    intra, inter = Link(1e-6, 1e-10), Link(2e-6, 1e-9)
    # 4 nodes × 2 ranks, 1 NIC: reduce-scatter (α_i + ½nβ_i), ring over 4 nodes on n/2 bytes with
    # the NIC shared by 2 ranks (β×2): 6α_e + 2·¾·(n/2)·2β_e, allgather (α_i + ½nβ_i)
    scatter = 1e-6 + 0.5 * N * 1e-10
    across = 6 * 2e-6 + 2 * 0.75 * (N / 2) * 2e-9
    assert hierarchical_s(4, 2, N, intra, inter) == pytest.approx(2 * scatter + across, rel=1e-12)
    # two NICs per node: the inter-node term gets each rank its own NIC
    across2 = 6 * 2e-6 + 2 * 0.75 * (N / 2) * 1e-9
    assert hierarchical_s(4, 2, N, intra, inter, nics_per_node=2) == \
        pytest.approx(2 * scatter + across2, rel=1e-12)


def test_flat_topology_reduces_to_closed_forms_on_one_link():
    for algo, fn in [("ring", ring_s), ("rd", recursive_doubling_s), ("rhd", halving_doubling_s)]:
        for p in (2, 8, 32):
            assert flat_s(algo, p, 1, N, LINK, LINK) == pytest.approx(fn(p, N, LINK), rel=1e-12)
            assert flat_s(algo, 1, p, N, LINK, LINK) == pytest.approx(fn(p, N, LINK), rel=1e-12)


def test_flat_rhd_uses_intra_link_for_near_partners():
    intra, inter = Link(0.0, 1e-11), Link(0.0, 1e-9)
    # 2 nodes × 2 ranks: halving step 1 at distance 2 (inter, NIC shared by 2, n/2 bytes),
    # step 2 at distance 1 (intra, n/4 bytes); allgather mirrors it
    expect = 2 * (N / 2) * 2e-9 + 2 * (N / 4) * 1e-11
    assert flat_s("rhd", 2, 2, N, intra, inter) == pytest.approx(expect, rel=1e-12)


def test_fp16_halves_the_bandwidth_term_and_adds_conversion():
    bw_only = Link(0.0, B, 0.0)
    for algo in ("ring", "rd", "rhd", "hierarchical"):
        full = allreduce_s(algo, 8, 4, N, bw_only, bw_only)
        half = allreduce_s(algo, 8, 4, N, bw_only, bw_only, compression="fp16")
        assert half == pytest.approx(full / 2, rel=1e-12)
    conv = allreduce_s("ring", 8, 4, N, bw_only, bw_only, compression="fp16", convert_s_per_elem=1e-10)
    assert conv - allreduce_s("ring", 8, 4, N, bw_only, bw_only, compression="fp16") == \
        pytest.approx(2 * (N / 4) * 1e-10, rel=1e-9)


@pytest.mark.parametrize("algo", ["ring", "rd", "rhd", "hierarchical"])
def test_monotone_in_message_size_and_rank_count(algo):
    intra, inter = Link(5e-6, 1e-11, 3e-12), Link(2e-6, 1e-10, 3e-12)
    sizes = [2.0 ** k for k in range(3, 28)]
    times = [allreduce_s(algo, 16, 4, n, intra, inter) for n in sizes]
    assert all(b > a for a, b in zip(times, times[1:]))
    by_nodes = [allreduce_s(algo, nodes, 4, 25e6, intra, inter) for nodes in (1, 2, 4, 8, 16, 64, 256)]
    assert all(b >= a for a, b in zip(by_nodes, by_nodes[1:]))


def test_single_rank_costs_nothing_and_bad_names_fail():
    assert allreduce_s("ring", 1, 1, N, LINK, LINK) == 0.0
    with pytest.raises(ValueError, match="compression"):
        allreduce_s("ring", 2, 1, N, LINK, LINK, compression="int8")
    assert math.isfinite(hierarchical_s(1, 4, N, LINK, LINK))
