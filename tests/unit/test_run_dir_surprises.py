"""Start-up checks of issue 37 item 5: run-directory surprises, the loader's memory, train.threads."""
import os
import stat

import pytest

from hpctrain.job.config import Config, ConfigError, validate
from hpctrain.data.memory import LoaderTooLarge, check_loader_memory, loader_bytes
from hpctrain.ops.rundircheck import run_dir_problem


def test_a_clean_or_missing_run_directory_passes(tmp_path):
    assert run_dir_problem(str(tmp_path / "new"), str(tmp_path / "new" / "checkpoints")) is None
    assert os.listdir(tmp_path) == []                  # nothing made, no probe file left


@pytest.mark.parametrize("name, make, needle", [
    ("state.json", os.mkdir, "state.json is a directory, not a file"),
    ("metrics.jsonl", os.mkfifo, "metrics.jsonl is a FIFO, not a file"),
    ("run_id", os.mkdir, "run_id is a directory"),
])
def test_something_else_in_place_of_a_file_is_named(tmp_path, name, make, needle):
    make(str(tmp_path / name))
    problem = run_dir_problem(str(tmp_path), str(tmp_path / "checkpoints"))
    assert problem is not None and needle in problem and str(tmp_path) in problem


def test_checkpoints_that_is_a_file_is_named(tmp_path):
    (tmp_path / "checkpoints").write_text("x")
    assert "checkpoints is a file, not a directory" in run_dir_problem(str(tmp_path),
                                                                                    str(tmp_path / "checkpoints"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_an_unwritable_checkpoint_directory_is_found_at_start(tmp_path):
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    ck.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert "cannot write there" in run_dir_problem(str(tmp_path), str(ck))
    finally:
        ck.chmod(stat.S_IRWXU)


class Index:
    sample_shape, dtype = (3, 224, 224), "uint8"


def test_a_window_too_large_for_memory_is_refused_before_allocation():
    per_sample = 3 * 224 * 224
    assert loader_bytes((3, 224, 224), "uint8", batch_size=1, shuffle_window=10, prefetch=0) == \
        2 * 10 * (per_sample + 8) + 1 * (per_sample * 4 + 8)
    check_loader_memory(Index(), batch_size=64, shuffle_window=1024, prefetch=2, available=64 << 30)
    with pytest.raises(LoaderTooLarge, match=r"^train_loader shuffle_window: a window of 10,000,000 samples .* rank"):
        check_loader_memory(Index(), batch_size=64, shuffle_window=10**7, prefetch=2, available=64 << 30)
    with pytest.raises(LoaderTooLarge, match=r"^train_loader batch_size: .* each of the node's 8 rank"):
        check_loader_memory(Index(), batch_size=10**6, shuffle_window=1024, prefetch=2, local_size=8,
                            available=64 << 30)


def test_threads_beyond_a_few_per_core_are_refused():
    cfg = Config()
    cfg.train.threads = 4 * (os.cpu_count() or 1)
    validate(cfg)
    cfg.train.threads = 1_000_000
    with pytest.raises(ConfigError, match=r"config train.threads: 1000000 threads per rank is more than 4 per core"):
        validate(cfg)


def test_jpeg_window_is_sized_from_the_encoded_bytes_plus_the_decode_pool(tmp_path):
    from types import SimpleNamespace

    from hpctrain.data.jpegstream import LOOKAHEAD
    from hpctrain.data.memory import BLOB_OVERHEAD, jpeg_bytes_per_sample
    (tmp_path / "a.h5").write_bytes(b"\0" * 30_000)          # one file sized on disk, one from the index
    shards = [{"file": "a.h5", "num_samples": 2}, {"file": "b.h5", "num_samples": 4, "blocks": {"file_bytes": 90_000}}]
    idx = SimpleNamespace(directory=str(tmp_path), sample_shape=(3, 224, 224), dtype="uint8", encoding="jpeg",
                          splits={"train": {"num_samples": 6, "shards": shards}})
    assert jpeg_bytes_per_sample(idx) == 120_000 / 6
    decoded, batch, window, prefetch = 3 * 224 * 224, 64, 100_000, 2
    want = (2 * window * (20_000 + BLOB_OVERHEAD + 8) + (prefetch + 1) * batch * (decoded * 4 + 8)
            + (prefetch + 2 + LOOKAHEAD) * batch * decoded)
    assert loader_bytes(idx.sample_shape, "uint8", batch_size=batch, shuffle_window=window, prefetch=prefetch,
                        stored_bytes=20_000) == want
    # 100k decoded samples (~30 GiB) would be refused; 100k encoded ones (~4 GiB) fit in 16 GiB
    check_loader_memory(idx, batch_size=batch, shuffle_window=window, prefetch=prefetch, available=16 << 30)
    with pytest.raises(LoaderTooLarge, match=r"shuffle_window: .* JPEG \(~20 KiB each"):
        check_loader_memory(idx, batch_size=batch, shuffle_window=window, prefetch=prefetch, available=6 << 30)
    with pytest.raises(LoaderTooLarge):
        check_loader_memory(Index(), batch_size=batch, shuffle_window=window, prefetch=prefetch, available=16 << 30)
