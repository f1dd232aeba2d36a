"""The allreduce benchmark runs end to end and writes the documented JSON rows."""
import json

import pytest
from mpi4py import MPI

from hpctrain.tools.bench import allreduce


def n_nodes(comm):
    """Nodes of the benchmark's topology (--ranks-per-node 2)."""
    return -(-comm.Get_size() // 2)


@pytest.mark.mpi
def test_bench_writes_every_row(tmp_path):
    comm = MPI.COMM_WORLD
    path = comm.bcast(str(tmp_path / "rows.json"), root=0)
    assert allreduce.main(["--sizes", "4K,128K", "--iters", "2", "--warmup", "1",
                           "--ranks-per-node", "2", "--json", path]) == 0
    if comm.Get_rank() != 0:
        return
    rows = json.load(open(path))
    impls = {(r["impl"], r["compression"], r["scope"]) for r in rows}
    pairs = {(s, c) for s in ("flat", "hierarchical") for c in ("none", "fp16")}
    floor = {("memory", "none", "floor")} if n_nodes(comm) == 1 and comm.Get_size() > 1 else set()
    assert impls == ({("mpi4py", "none", "collective"), ("mpi4py", "none", "+mean"), ("gloo", "none", "collective")}
                     | {(s, c, scope) for s, c in pairs for scope in ("collective", "whole")} | floor)
    n = comm.Get_size()
    for r in rows:
        assert set(r) == {"impl", "compression", "scope", "ranks_per_node", "world_size", "bytes", "time_s",
                          "algbw_GBps", "busbw_GBps"}
        assert r["world_size"] == n and r["ranks_per_node"] == min(2, n) and r["time_s"] > 0
        assert r["bytes"] in (4096, 128 * 1024)
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * (n - 1) / n)
