"""What the bench MPI tests share: run a bench's ``main`` end to end into a JSON file and read the
rows back (rank 0; the path is rank 0's, broadcast so every rank writes where it reads)."""
import json

from mpi4py import MPI


def bench_rows(main, tmp_path, configs: str, warmup: int) -> list[dict] | None:
    """``main``'s rows for ``digits_cnn`` and ``configs`` (2 rounds of 1 step, batch 4) on rank 0,
    None on the others, after checking every contender has its row in order."""
    comm = MPI.COMM_WORLD
    path = comm.bcast(str(tmp_path / "rows.json"), root=0)
    assert main(["--models", "digits_cnn", "--configs", configs, "--batch", "4", "--steps", "1",
                 "--rounds", "2", "--warmup", str(warmup), "--json", path]) == 0
    if comm.Get_rank() != 0:
        return None
    rows = json.load(open(path))
    assert [r["config"] for r in rows] == configs.split(",")
    for r in rows:
        assert r["model"] == "digits_cnn" and r["world_size"] == comm.Get_size()
        assert len(r["rounds_ms"]) == 2 and r["x_ddp"] > 0
    return rows
