"""What the emulated links allow: wire-time floors and speed-up bounds for flat vs hierarchical
allreduce and fp32 vs fp16, next to measured ``bench allreduce`` rows.

Bytes a node must send across its link for one allreduce of S bytes over p = N·k ranks (N nodes,
k consecutive ranks each), bandwidth-optimal algorithms [Thakur et al. 2005; Patarasuk & Yuan
2009]:

* flat ring over all p ranks: the ring leaves each node once, and that edge carries the whole
  ring's traffic, 2(p-1)/p · S;
* hierarchical (node level in shared memory, then each of the k local ranks allreduces S/k with
  its peers on the other nodes): k · 2(N-1)/N · S/k = 2(N-1)/N · S.

So the hierarchical speed-up on the wire is [(p-1)/p] / [(N-1)/N]: 1.5 for 2 nodes × 2 ranks,
1.75 for 2 × 4, tending to 1 as N grows (the two-level scheme's gain on a flat network is fewer,
larger messages — latency — not bytes). fp16 halves every byte: 2.
Each byte costs 1514/1448 on the link (Ethernet + IPv4 + TCP-with-timestamps headers per 1448
payload bytes of a 1500-byte MTU frame; tbf counts whole frames).
"""
from __future__ import annotations

FRAME_OVERHEAD = 1514 / 1448


def node_wire_bytes(impl: str, n_bytes: float, n_nodes: int, ranks_per_node: int) -> float:
    """Bytes one node sends over its link in one allreduce of ``n_bytes`` (payload only)."""
    p = n_nodes * ranks_per_node
    if n_nodes < 2:
        return 0.0
    if impl == "hierarchical":
        return 2 * (n_nodes - 1) / n_nodes * n_bytes
    return 2 * (p - 1) / p * n_bytes                       # flat ring (and mpi4py's large-message ring)


def wire_floor_s(impl: str, compression: str, n_bytes: float, n_nodes: int, ranks_per_node: int,
                 rate_bit_s: float) -> float:
    """The link time alone, no computation or latency: the least an allreduce can take."""
    if rate_bit_s <= 0:
        return 0.0
    wire = n_bytes / 2 if compression == "fp16" else n_bytes
    return node_wire_bytes(impl, wire, n_nodes, ranks_per_node) * FRAME_OVERHEAD * 8 / rate_bit_s


# (name, (impl, compression) of the baseline, (impl, compression) compared, target speed-up)
COMPARISONS = [("hierarchical vs flat, fp32", ("flat", "none"), ("hierarchical", "none"), 1.5),
               ("hierarchical vs flat, fp16", ("flat", "fp16"), ("hierarchical", "fp16"), 1.5),
               ("fp16 vs fp32, flat", ("flat", "none"), ("flat", "fp16"), 1.7),
               ("fp16 vs fp32, hierarchical", ("hierarchical", "none"), ("hierarchical", "fp16"), 1.7)]


def compare(rows: list[dict], n_nodes: int, rate_bit_s: float) -> list[dict]:
    """One dict per (size, comparison) found in ``rows`` (``bench allreduce --json`` rows):
    measured times, speed-up, the wire-level bound of that speed-up, and the target."""
    times = {(r["bytes"], r["impl"], r["compression"]): r for r in rows}
    out = []
    for n_bytes in sorted({r["bytes"] for r in rows}):
        for name, base, new, target in COMPARISONS:
            a, b = times.get((n_bytes, *base)), times.get((n_bytes, *new))
            if a is None or b is None:
                continue
            k = int(a["ranks_per_node"])
            fa = wire_floor_s(*base, n_bytes, n_nodes, k, rate_bit_s)
            fb = wire_floor_s(*new, n_bytes, n_nodes, k, rate_bit_s)
            out.append({"bytes": n_bytes, "comparison": name, "base_s": a["time_s"], "new_s": b["time_s"],
                        "speedup": a["time_s"] / b["time_s"], "wire_bound": fa / fb if fb > 0 else None,
                        "base_floor_s": fa, "new_floor_s": fb, "target": target})
    return out


def format_comparison(results: list[dict]) -> str:
    head = (f"{'size':>8}  {'comparison':<27} {'base ms':>8} {'new ms':>8} {'speed-up':>8} "
            f"{'wire bound':>10} {'target':>7}  floors ms (base/new)")
    lines = [head, "-" * len(head)]
    for r in results:
        bound = f"{r['wire_bound']:.2f}x" if r["wire_bound"] else "-"
        mark = "ok" if r["speedup"] >= r["target"] else "below"
        lines.append(f"{r['bytes'] / 2**20:>6.0f}Mi  {r['comparison']:<27} {1e3 * r['base_s']:8.1f} "
                     f"{1e3 * r['new_s']:8.1f} {r['speedup']:7.2f}x {bound:>10} {r['target']:>5.1f}x "
                     f"{mark:<5} {1e3 * r['base_floor_s']:.0f}/{1e3 * r['new_floor_s']:.0f}")
    return "\n".join(lines)
