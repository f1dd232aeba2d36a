"""The loader's memory refusal names the argument that made it too big (the job maps it to its
config key: tests/unit/test_loader_refusal_keys.py)."""
import pytest

from hpctrain.data.memory import LoaderTooLarge, check_loader_memory, loader_parts


class Index:
    sample_shape, dtype = (1, 8, 8), "float32"


def test_a_huge_prefetch_is_blamed_on_data_prefetch_not_the_window():
    n = 64                                    # one 8x8 float32 sample
    parts = loader_parts((1, 8, 8), "float32", batch_size=32, shuffle_window=1024, prefetch=1_000_000)
    assert parts == {"shuffle_window": 2 * 1024 * (n * 4 + 8), "prefetch": 1_000_001 * 32 * (n * 4 + 8)}
    with pytest.raises(LoaderTooLarge, match=r"^train_loader prefetch: 1,000,001 prefetched batches of 32 samples"):
        check_loader_memory(Index(), batch_size=32, shuffle_window=1024, prefetch=1_000_000, available=8 << 30)


def test_a_huge_window_is_still_blamed_on_the_window():
    with pytest.raises(LoaderTooLarge, match=r"^train_loader shuffle_window: a window of 100,000,000 samples"):
        check_loader_memory(Index(), batch_size=32, shuffle_window=10**8, prefetch=2, available=8 << 30)
