"""The step benchmark runs end to end in one MPI job and writes one JSON row per contender."""
import pytest

from hpctrain.tools.bench import step
from tests.mpi.bench_rows import bench_rows


@pytest.mark.mpi
def test_bench_step_writes_a_row_per_contender(tmp_path):
    rows = bench_rows(step.main, tmp_path, "nocomm,ddp,default,flat+overlap,hierarchical+fp16", warmup=1)
    if rows is None:
        return
    assert all(r["step_ms"] > 0 for r in rows)
    assert rows[1]["x_ddp"] == 1.0
