"""α-β-γ cost model of allreduce algorithms: pure functions, seconds for one allreduce.

Hockney's model: sending m bytes costs α + m·β; reducing m bytes costs m·γ. Closed forms follow
Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 19(1), 2005, §4.4 (allreduce):

    ring (reduce-scatter + allgather)  2(p−1)α + 2(p−1)/p·nβ + (p−1)/p·nγ
    recursive doubling                 ⌈log2 p⌉(α + nβ + nγ)
    recursive halving-doubling         2 log2 p·α + 2(p−1)/p·nβ + (p−1)/p·nγ   (Rabenseifner)

For p not a power of two, recursive doubling and halving-doubling first fold the r = p − 2^⌊log2 p⌋
extra ranks into partners (α + nβ + nγ) and send them the result at the end (α + nβ) [Thakur §4.4].

Topology (``nodes`` × ``ranks_per_node`` with block placement) enters through which link a step
uses: a step between ranks on different nodes uses ``inter``, whose per-node NICs are shared by
every rank of the node that sends at the same time; a step inside a node uses ``intra``.
The hierarchical algorithm is the two-level scheme of ChainerMN's ``hierarchical`` communicator and
HSGD (Wang et al., IEICE 2020): intra-node reduce-scatter, inter-node allreduce among the ranks with
the same local index on n/L bytes each (L such allreduces share the node's NICs), intra-node
allgather.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["Link", "ring_s", "recursive_doubling_s", "halving_doubling_s", "flat_s",
           "hierarchical_s", "allreduce_s", "fp16_conversion_s", "ALGORITHMS"]


@dataclass(frozen=True)
class Link:
    """One link class: α [s per message], β [s per byte], γ [s per byte reduced]."""

    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float = 0.0

    def shared(self, streams: float) -> Link:
        """The link as seen by one sender when ``streams`` senders share it (β × streams);
        ``streams`` < 1 means one sender spreads over several NICs."""
        return replace(self, beta_s_per_byte=self.beta_s_per_byte * streams)


def ring_s(p: int, n_bytes: float, link: Link) -> float:
    """Ring allreduce (reduce-scatter then allgather) over one link class."""
    if p <= 1:
        return 0.0
    frac = (p - 1) / p
    return 2 * (p - 1) * link.alpha_s + 2 * frac * n_bytes * link.beta_s_per_byte \
        + frac * n_bytes * link.gamma_s_per_byte


def _fold(p: int) -> tuple[int, int]:
    """(p', r): the largest power of two p' ≤ p and the r = p − p' ranks folded into it."""
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def _fold_s(r: int, n_bytes: float, link: Link) -> float:
    """Extra cost of folding r > 0 ranks in (send + reduce) and out (send the result)."""
    if r == 0:
        return 0.0
    return (link.alpha_s + n_bytes * (link.beta_s_per_byte + link.gamma_s_per_byte)) \
        + (link.alpha_s + n_bytes * link.beta_s_per_byte)


def recursive_doubling_s(p: int, n_bytes: float, link: Link) -> float:
    """Recursive doubling: log2 p' exchanges of the whole vector, each reduced."""
    if p <= 1:
        return 0.0
    p2, r = _fold(p)
    steps = int(math.log2(p2))
    return steps * (link.alpha_s + n_bytes * (link.beta_s_per_byte + link.gamma_s_per_byte)) \
        + _fold_s(r, n_bytes, link)


def halving_doubling_s(p: int, n_bytes: float, link: Link) -> float:
    """Rabenseifner: reduce-scatter by recursive halving, allgather by recursive doubling."""
    if p <= 1:
        return 0.0
    p2, r = _fold(p)
    frac = (p2 - 1) / p2
    body = 2 * math.log2(p2) * link.alpha_s + 2 * frac * n_bytes * link.beta_s_per_byte \
        + frac * n_bytes * link.gamma_s_per_byte
    return body + _fold_s(r, n_bytes, link)


ALGORITHMS = {"ring": ring_s, "rd": recursive_doubling_s, "rhd": halving_doubling_s}


def _step_link(distance: int, ranks_per_node: int, intra: Link, inter: Link,
               nics_per_node: int) -> Link:
    """Link used by an exchange between ranks ``distance`` apart under block placement."""
    if distance < ranks_per_node:
        return intra
    # every rank of the node exchanges across the network at once: the NICs are shared
    return inter.shared(ranks_per_node / nics_per_node)


def flat_s(algo: str, nodes: int, ranks_per_node: int, n_bytes: float, intra: Link, inter: Link,
           nics_per_node: int = 1) -> float:
    """One flat allreduce over nodes × ranks_per_node ranks, each step on the link it crosses.

    Ring: with ranks ordered node by node, each node has one outgoing network hop per ring
    (NCCL opens one ring per NIC), and every step waits for its slowest hop, so all 2(p−1) steps
    run at the network's α and the NICs' aggregate bandwidth. Recursive doubling / halving-doubling:
    exchanges at distance ≥ ranks_per_node cross the network with all local ranks at once.
    """
    p = nodes * ranks_per_node
    if p <= 1:
        return 0.0
    if nodes == 1:
        return ALGORITHMS[algo](p, n_bytes, intra)
    if algo == "ring":
        return ring_s(p, n_bytes, inter.shared(1.0 / nics_per_node))
    p2, r = _fold(p)
    worst = _step_link(p, ranks_per_node, intra, inter, nics_per_node)
    total = _fold_s(r, n_bytes, worst)
    steps = int(math.log2(p2))
    for k in range(1, steps + 1):
        if algo == "rd":  # distances 1, 2, 4, ...; whole vector each time
            link = _step_link(1 << (k - 1), ranks_per_node, intra, inter, nics_per_node)
            total += link.alpha_s + n_bytes * (link.beta_s_per_byte + link.gamma_s_per_byte)
        elif algo == "rhd":  # halving: distance p'/2^k, n/2^k bytes; doubling mirrors it
            link = _step_link(p2 >> k, ranks_per_node, intra, inter, nics_per_node)
            m = n_bytes / (1 << k)
            total += 2 * link.alpha_s + 2 * m * link.beta_s_per_byte + m * link.gamma_s_per_byte
        else:
            raise ValueError(f"unknown allreduce algorithm {algo!r}; choose from {sorted(ALGORITHMS)}")
    return total


def hierarchical_s(nodes: int, ranks_per_node: int, n_bytes: float, intra: Link, inter: Link,
                   inter_algo: str = "ring", nics_per_node: int = 1) -> float:
    """Two-level allreduce: intra reduce-scatter, inter allreduce on n/L, intra allgather."""
    L = ranks_per_node
    if nodes * L <= 1:
        return 0.0
    if nodes == 1:
        return ring_s(L, n_bytes, intra)
    frac = (L - 1) / L
    scatter = (L - 1) * intra.alpha_s + frac * n_bytes * (intra.beta_s_per_byte + intra.gamma_s_per_byte)
    gather = (L - 1) * intra.alpha_s + frac * n_bytes * intra.beta_s_per_byte
    across = ALGORITHMS[inter_algo](nodes, n_bytes / L, inter.shared(L / nics_per_node))
    return scatter + across + gather


def fp16_conversion_s(n_bytes_fp32: float, convert_s_per_elem: float) -> float:
    """fp32→fp16 before and fp16→fp32 after the allreduce: two passes over n/4 elements."""
    return 2 * (n_bytes_fp32 / 4) * convert_s_per_elem


def allreduce_s(algo: str, nodes: int, ranks_per_node: int, n_bytes: float, intra: Link,
                inter: Link, *, inter_algo: str = "ring", nics_per_node: int = 1,
                compression: str = "none", convert_s_per_elem: float = 0.0) -> float:
    """Time of one allreduce of an fp32 buffer of ``n_bytes``; ``algo`` is a flat algorithm name
    or ``"hierarchical"``; ``compression="fp16"`` sends half the bytes and pays the conversions."""
    if nodes * ranks_per_node <= 1:
        return 0.0
    if compression == "fp16":
        wire, extra = n_bytes / 2, fp16_conversion_s(n_bytes, convert_s_per_elem)
    elif compression == "none":
        wire, extra = n_bytes, 0.0
    else:
        raise ValueError(f"unknown compression {compression!r}; choose none or fp16")
    if algo == "hierarchical":
        return hierarchical_s(nodes, ranks_per_node, wire, intra, inter, inter_algo, nics_per_node) + extra
    return flat_s(algo, nodes, ranks_per_node, wire, intra, inter, nics_per_node) + extra
