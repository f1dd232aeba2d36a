"""The CLI job on a shard with one flipped byte: status 2, one line naming the shard, no traceback.

Before the integrity check such a job trained to the end with status 0 (81.6 % instead of 99 %).
"""
import json
import os
import shutil

import pytest

from tests.integration.inprocess import run_cli
from tests.integration.mpirun import hpctrain_lines, mpirun
from tests.shard_files import convert_digits, flip


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return convert_digits(tmp_path_factory.mktemp("corrupt") / "digits")


def train(data: str, run_dir, n: int = 2, extra=()):
    return mpirun(n, ["-m", "hpctrain", "--run-dir", str(run_dir), "--epochs", "1", "--data", data,
                      "--no-progress", *extra], timeout=180)


NODE_READER = ("--ranks-per-node", "2", "--set", "data.reader=node")


@pytest.mark.parametrize("shard,pos,extra", [("train-00001-of-00004.h5", 7000, ()),
                                             ("test-00003-of-00004.h5", 900, ()),
                                             ("train-00003-of-00004.h5", 900, NODE_READER)])
def test_flipped_byte_stops_the_job_with_one_line(digits, tmp_path, capsys, shard, pos, extra):
    """Also with one reader per node: the other local ranks must not wait for its window. The
    check runs when the shards are opened, before any step: the cases with one reader per rank
    call the CLI in process (one rank); the node reader's is the data refusal's real launch."""
    d = str(tmp_path / "data")
    shutil.copytree(digits, d)
    flip(os.path.join(d, shard), pos)
    if extra:
        r, secs = train(d, tmp_path / "run", extra=extra)
    else:
        r = run_cli(capsys, "--run-dir", str(tmp_path / "run"), "--epochs", "1", "--data", d, "--no-progress")
        secs = 0.0
    ours = hpctrain_lines(r.stderr)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and len(ours) == 1, r.stderr[-2000:]
    assert ours[0].startswith(f"hpctrain: error: {os.path.join(d, shard)}: checksum mismatch")
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl") or "summary" not in (
        tmp_path / "run" / "metrics.jsonl").read_text()
    assert secs < 120


def test_intact_data_trains(digits, tmp_path):
    r, _ = train(digits, tmp_path / "run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "test accuracy" in r.stdout


def test_bad_label_found_by_one_rank_mid_run_aborts_with_one_line(digits, tmp_path):
    """A label out of range behind a valid checksum (a converter bug, say) is found by the one rank
    whose block holds it, mid-epoch, while the others wait in the gradient allreduce: that rank
    prints one line naming itself and the shard and ends the job with status 2, no traceback."""
    import h5py

    from hpctrain.data.shardwriter import shard_digests
    d = str(tmp_path / "data")
    shutil.copytree(digits, d)
    shard = os.path.join(d, "train-00002-of-00004.h5")
    with h5py.File(shard, "r+") as fh:
        fh["y"][5] = 99
    index = json.load(open(os.path.join(d, "index.json")))
    for entry in index["splits"]["train"]["shards"]:
        if entry["file"] == os.path.basename(shard):
            entry.update(shard_digests(shard, entry["blocks"]["bytes"]))
    json.dump(index, open(os.path.join(d, "index.json"), "w"))
    r, secs = train(d, tmp_path / "run")
    ours = hpctrain_lines(r.stderr)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert ours[0].startswith("hpctrain: error: rank ") and f"{shard}: sample 5" in ours[0], ours
    assert "label 99, outside 0..9" in ours[0] and ours[1:] == ["hpctrain: aborting all 2 ranks"], ours
    assert secs < 120


@pytest.mark.parametrize("extra", [(), NODE_READER])
def test_bad_data_block_found_mid_epoch_aborts_before_its_step(tmp_path, extra):
    """Index v3 with 1 KiB blocks: the open passes (metadata intact) and the rank whose read first
    touches the changed block raises in its loader thread, before the step that would use the
    batch: one line naming itself, the shard and the block, all ranks aborted, status 2. With one
    reader per node, the reader's line (the other rank waits for its abort instead of printing)."""
    import h5py
    d = convert_digits(tmp_path / "data", block_kib=1)
    shard = os.path.join(d, "train-00001-of-00004.h5")
    with h5py.File(shard, "r") as fh:
        pos = fh["x"].id.get_offset() + 64 * 300 + 7
    k = pos // 1024
    index = json.load(open(os.path.join(d, "index.json")))
    entry = next(e for e in index["splits"]["train"]["shards"] if e["file"] == os.path.basename(shard))
    assert any(a <= k < b for a, b in entry["blocks"]["data"])        # a block checked on read
    flip(shard, pos)
    r, secs = train(d, tmp_path / "run", extra=extra)
    ours = hpctrain_lines(r.stderr)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert ours[0].startswith("hpctrain: error: rank ") and ours[0].endswith(
        f"{shard}: checksum mismatch in block {k} (bytes {k * 1024}..{(k + 1) * 1024}; file changed or corrupted)"), ours
    assert ours[1:] == ["hpctrain: aborting all 2 ranks"], ours
    assert "test accuracy" not in r.stdout and "summary" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    assert secs < 120
