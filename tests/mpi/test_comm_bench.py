"""The allreduce benchmark runs end to end and writes the documented JSON rows."""
import json

import pytest
from mpi4py import MPI

from hpctrain.bench import allreduce


@pytest.mark.mpi
def test_bench_writes_every_row(tmp_path):
    comm = MPI.COMM_WORLD
    path = comm.bcast(str(tmp_path / "rows.json"), root=0)
    assert allreduce.main(["--sizes", "4K,128K", "--iters", "2", "--warmup", "1",
                           "--ranks-per-node", "2", "--json", path]) == 0
    if comm.Get_rank() != 0:
        return
    rows = json.load(open(path))
    impls = {(r["impl"], r["compression"]) for r in rows}
    assert impls == {("mpi4py", "none"), ("gloo", "none"), ("flat", "none"), ("flat", "fp16"),
                     ("hierarchical", "none"), ("hierarchical", "fp16")}
    n = comm.Get_size()
    for r in rows:
        assert set(r) == {"impl", "compression", "ranks_per_node", "world_size", "bytes", "time_s",
                          "algbw_GBps", "busbw_GBps"}
        assert r["world_size"] == n and r["ranks_per_node"] == min(2, n) and r["time_s"] > 0
        assert r["bytes"] in (4096, 128 * 1024)
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * (n - 1) / n)
