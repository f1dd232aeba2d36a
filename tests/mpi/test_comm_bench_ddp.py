"""The DDP benchmark runs end to end in one MPI job: a JSON row per model and contender, DDP
the baseline, the hook's rows saying how hpctrain reduced DDP's buckets."""
import json

import pytest
import torch.distributed as dist
from mpi4py import MPI

from hpctrain.bench import ddp


@pytest.mark.mpi
def test_bench_ddp_writes_a_row_per_contender(tmp_path):
    comm = MPI.COMM_WORLD
    path = comm.bcast(str(tmp_path / "rows.json"), root=0)
    configs = "nocomm,ddp,hook,hook:flat+fp16,trainer"
    assert ddp.main(["--models", "digits_cnn", "--configs", configs, "--batch", "4", "--steps", "1",
                     "--rounds", "2", "--warmup", "2", "--json", path]) == 0
    assert not dist.is_initialized()            # the benchmark destroyed its process group
    if comm.Get_rank() != 0:
        return
    rows = json.load(open(path))
    assert [r["config"] for r in rows] == configs.split(",")
    for r in rows:
        assert r["model"] == "digits_cnn" and r["world_size"] == comm.Get_size()
        assert len(r["rounds_ms"]) == 2 and r["steps_per_s"] > 0 and r["x_ddp"] > 0
    assert rows[1]["x_ddp"] == 1.0 and rows[1]["describe"] == "gloo allreduce"
    assert rows[2]["describe"].startswith("bucket 0: ")
    assert "flat, compression=fp16" in rows[3]["describe"]
    assert rows[4]["describe"].startswith(("hierarchical", "flat"))


@pytest.mark.mpi
def test_config_names():
    assert ddp.parse_config("ddp") is None and ddp.parse_config("nocomm") is None
    assert ddp.parse_config("hook") == {"strategy": "auto", "compression": "none"}
    assert ddp.parse_config("hook:hierarchical+fp16") == {"strategy": "hierarchical", "compression": "fp16"}
    with pytest.raises(ValueError, match="hook"):
        ddp.parse_config("hook+bf16")
