"""The step benchmark runs end to end in one MPI job and writes one JSON row per contender."""
import json

import pytest
from mpi4py import MPI

from hpctrain.bench import step


@pytest.mark.mpi
def test_bench_step_writes_a_row_per_contender(tmp_path):
    comm = MPI.COMM_WORLD
    path = comm.bcast(str(tmp_path / "rows.json"), root=0)
    configs = "nocomm,ddp,default,flat+overlap,hierarchical+fp16"
    assert step.main(["--models", "digits_cnn", "--configs", configs, "--batch", "4", "--steps", "1",
                      "--rounds", "2", "--warmup", "1", "--json", path]) == 0
    if comm.Get_rank() != 0:
        return
    rows = json.load(open(path))
    assert [r["config"] for r in rows] == configs.split(",")
    for r in rows:
        assert r["model"] == "digits_cnn" and r["world_size"] == comm.Get_size()
        assert len(r["rounds_ms"]) == 2 and r["step_ms"] > 0 and r["x_ddp"] > 0
    assert rows[1]["x_ddp"] == 1.0
