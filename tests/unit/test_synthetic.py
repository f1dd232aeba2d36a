"""The generated held-out datasets: registered, deterministic, the documented shapes and classes."""
import numpy as np

import hpctrain.data_tools.synthetic  # noqa: F401  (registers the sources)
from hpctrain.data_tools.sources import SOURCES
from hpctrain.data_tools.synthetic import make_pulses, make_signals
from hpctrain.data_tools.builtin import BUILTIN_DATASETS


def test_signals_are_deterministic_and_separate_by_class():
    x, y = make_signals(2000, seed=3)
    x2, y2 = make_signals(2000, seed=3)
    assert x.shape == (2000, 1, 64) and x.dtype == np.float32 and np.isfinite(x).all()
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert set(y.tolist()) == set(range(10))
    # classes differ in frequency content: the mean spectral peak rises with the band (sines)
    peak = [np.abs(np.fft.rfft(x[y == c, 0], axis=1)).mean(0)[1:].argmax() + 1 for c in (0, 1, 2)]
    assert peak[0] < peak[1] < peak[2]


def test_sources_are_registered_builtins_with_train_and_test_splits():
    for name, shape, classes in (("signal1d", (1, 64), 10), ("tabular", (32,), 8), ("spirals", (16,), 5),
                                  ("pulses", (1, 64), 8)):
        assert name in BUILTIN_DATASETS
        src = SOURCES[name](None, n_train=256, n_test=64)
        assert src.sample_shape == shape and len(src.class_names) == classes
        assert {k: s.num_samples for k, s in src.splits.items()} == {"train": 256, "test": 64}
        chunk = src.splits["test"].read(0, 8)
        assert chunk.x.shape == (8, *shape) and chunk.y.dtype == np.int64


def test_pulses_are_deterministic_and_count_their_pulses():
    x, y = make_pulses(4000, seed=5)
    np.testing.assert_array_equal(x, make_pulses(4000, seed=5)[0])
    assert x.shape == (4000, 1, 64) and x.dtype == np.float32 and set(y.tolist()) == set(range(8))
    # more pulses put more energy above the baseline: the class mean of the signal rises with the count
    means = [x[y // 2 == c].mean() for c in range(4)]
    assert means[0] < means[1] < means[2] < means[3]
