"""The report of ``python -m hpctrain bench io`` (:mod:`hpctrain.tools.bench.io`): medians of the
interleaved rounds, the integrity line and the table.

Kept apart from the measuring code so that what is timed and how it is summarised can be read
(and changed) separately; the row names live here because the report finds rows by them.
"""
from __future__ import annotations

CHECK, FIRST, FIRST_SHA, WHOLE, PLAIN, LOADER = (
    "whole-file SHA-256 check at open (v1/v2 index)", "first epoch, XXH3-128 per block as read (v5 index)",
    "first epoch, SHA-256 per block as read (v3 index)", "first epoch incl. whole-file SHA-256 check at open",
    "block plan, per-rank reading, serial", "full loader")


def medians(rows: list) -> list:
    """One row per method (first-seen order): the round of median time, the median CPU seconds."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    out = []
    for same in by.values():
        r = sorted(same, key=lambda r: r["seconds"])[len(same) // 2]
        cpu = sorted(r["cpu_s"] for r in same)[len(same) // 2]
        out.append({**r, "rounds": len(same), "cpu_s": cpu})
    return out



def table(rows: list, job: dict, header: str) -> str:
    out = [header, f"{'data':<13} {'method':<66} {'cache':<5} {'samples/s':>10} {'MB/s':>8} "
                   f"{'vs random':>9} {'vs cat':>7}"]
    base = {(r["data"], r["cache"]): r for r in rows if r["method"].startswith("per-sample")}
    cat = {(r["data"], r["cache"]): r for r in rows if r["method"].startswith("cat")}
    for r in rows:
        key = (r["data"], r["cache"])
        vr = r["samples_per_s"] / base[key]["samples_per_s"] if key in base else float("nan")
        vc = r["mb_per_s"] / cat[key]["mb_per_s"] if key in cat else float("nan")
        out.append(f"{r['data']:<13} {r['method']:<66} {r['cache']:<5} {r['samples_per_s']:>10.0f} "
                   f"{r['mb_per_s']:>8.0f} {vr:>8.1f}x {100 * vc:>6.0f}%")
    out += integrity(rows)
    out.append(f"default job (digits CNN, global batch 64, HDF5 {job['driver']}, {job['steps']} steps, "
               f"{job['step_ms']:.2f} ms/step): "
               f"data-wait share {100 * job['wait_share_mean']:.2f} % (worst rank {100 * job['wait_share_max']:.2f} %)")
    return "\n".join(out)


def integrity(rows: list) -> list[str]:
    """One line per cache state: the checks' cost against the same run's unchecked row (medians of
    the same interleaved rounds), in speed and in CPU seconds (the unchecked epoch's over the checked
    one's: the speed share a host with no spare core would see)."""
    out = []
    for cache in ("cold", "warm"):
        got: dict[str, dict] = {}
        plain: list = []
        for r in rows:
            if r["cache"] != cache or r["data"] != rows[0]["data"]:
                continue
            for m in (CHECK, FIRST, FIRST_SHA, WHOLE):
                if r["method"].startswith(m):
                    got.setdefault(m, r)
            if r["method"].startswith(PLAIN) and not plain:       # the serial row before the auto one
                plain = [r["samples_per_s"], r["cpu_s"]]
        if CHECK not in got or not plain:
            continue
        base = plain[0]
        cpu = plain[1]
        line = (f"integrity ({cache}): first epoch with per-block XXH3-128 as read (v5, row-aligned grid): "
                f"{100 * got[FIRST]['samples_per_s'] / base:.0f} % of the unchecked block plan "
                f"(CPU: {100 * cpu / got[FIRST]['cpu_s']:.0f} %); with per-block SHA-256 (v3): "
                f"{100 * got[FIRST_SHA]['samples_per_s'] / base:.0f} % "
                f"(CPU: {100 * cpu / got[FIRST_SHA]['cpu_s']:.0f} %); with the "
                f"whole-file check at open (v1/v2, {got[CHECK]['seconds']:.2f} s, {got[CHECK]['mb_per_s']:.0f} MB/s): "
                f"{100 * got[WHOLE]['samples_per_s'] / base:.0f} %; later epochs 100 % (same reads)")
        loaders = [r for r in rows if r["cache"] == cache and r["method"].startswith(LOADER)]
        if len(loaders) == 2:
            line += (f"; full loader with its check: "
                     f"{100 * loaders[1]['samples_per_s'] / loaders[0]['samples_per_s']:.0f} % of unchecked")
        out.append(line)
    return out
