"""The DDP benchmark runs end to end in one MPI job: a JSON row per model and contender, DDP
the baseline, the hook's rows saying how hpctrain reduced DDP's buckets."""
import pytest
import torch.distributed as dist

from hpctrain.tools.bench import ddp
from tests.mpi.bench_rows import bench_rows


@pytest.mark.mpi
def test_bench_ddp_writes_a_row_per_contender(tmp_path):
    rows = bench_rows(ddp.main, tmp_path, "nocomm,ddp,hook,hook:flat+fp16,trainer", warmup=2)
    assert not dist.is_initialized()            # the benchmark destroyed its process group
    if rows is None:
        return
    assert all(r["steps_per_s"] > 0 for r in rows)
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
