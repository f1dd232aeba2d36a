"""Generated datasets the project was never tuned on (``study held-out``; built-in ``signal1d``,
``tabular``, ``spirals``, ``pulses``).

Both are made from a fixed seed by numpy (and scikit-learn), so every machine converts the same
bytes; both are small enough that a 30-epoch run of their BN-free models takes seconds per rank.

- ``signal1d``: 1-D signals of 64 samples, 10 classes = 3 waveforms (sine, square, sawtooth) x 3
  frequency bands + a linear chirp; random amplitude, phase, DC offset and Gaussian noise, so
  the classes overlap a little (a good model scores about 95-99 %, not 100 %). Stored (N, 1, 64).
- ``tabular``: ``sklearn.datasets.make_classification``: 32 features (12 informative, 8
  redundant), 8 classes of 2 Gaussian clusters each, 3 % of labels flipped. Stored (N, 32).
- ``spirals``: 5 interleaved noisy spiral arms in the plane, one class each, embedded in 16
  features (the 2 coordinates, their products and squares, and 9 noise features). Stored (N, 16).
  Added after the recipe was fixed, and never used to choose any of its values.
- ``pulses``: 1-D signals of 64 samples with 1-4 localised pulses, each a Gaussian bump or a
  square step (8 classes = count x shape), one per randomly chosen quarter of the window, with
  random position, width and height, on a drifting baseline with noise. Stored (N, 1, 64). Never
  used to choose a value of the recipe (docs/large-batch.md).
"""
from __future__ import annotations

import numpy as np

from .sources import Source, from_arrays, source

SIGNAL_LENGTH = 64


def make_signals(n: int, seed: int, length: int = SIGNAL_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """``(x (n, 1, length) float32, y (n,) int64)`` of the ``signal1d`` dataset."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    t = np.arange(length, dtype=np.float64)[None, :] / length               # one window, [0, 1)
    band = np.array([2.0, 4.0, 7.0])                                          # cycles per window
    cycles = band[y % 3][:, None] * rng.uniform(0.85, 1.15, (n, 1))           # bands overlap at the edges
    phase = 2 * np.pi * (cycles * t + rng.uniform(0, 1, (n, 1)))
    sine, square, saw = np.sin(phase), np.sign(np.sin(phase)), 2 * ((phase / (2 * np.pi)) % 1.0) - 1
    wave = np.where((y // 3 == 0)[:, None], sine, np.where((y // 3 == 1)[:, None], square, saw))
    chirp = np.sin(2 * np.pi * (rng.uniform(1, 3, (n, 1)) * t + rng.uniform(2, 4, (n, 1)) * t ** 2
                                + rng.uniform(0, 1, (n, 1))))
    wave = np.where((y == 9)[:, None], chirp, wave)
    x = rng.uniform(0.5, 1.5, (n, 1)) * wave + rng.normal(0, 0.3, (n, 1)) + rng.normal(0, 0.6, (n, length))
    return x[:, None, :].astype(np.float32), y.astype(np.int64)


@source("signal1d")
def load_signal1d(src: str | None, *, n_train: int = 16384, n_test: int = 4096, seed: int = 0, **_) -> Source:
    """Generated 1-D signals, 10 classes (module docstring); ``src`` is ignored."""
    x, y = make_signals(n_train + n_test, seed)
    splits = {"train": (x[:n_train], y[:n_train]), "test": (x[n_train:], y[n_train:])}
    names = [f"{w}-{b}" for w in ("sine", "square", "saw") for b in ("low", "mid", "high")] + ["chirp"]
    return from_arrays(splits, names, "signal1d")


@source("tabular")
def load_tabular(src: str | None, *, n_train: int = 16384, n_test: int = 4096, seed: int = 0, **_) -> Source:
    """``make_classification`` features, 8 classes (module docstring); ``src`` is ignored."""
    from sklearn.datasets import make_classification
    x, y = make_classification(n_samples=n_train + n_test, n_features=32, n_informative=12, n_redundant=8,
                               n_classes=8, n_clusters_per_class=2, flip_y=0.03, class_sep=1.5, random_state=seed)
    x, y = x.astype(np.float32), y.astype(np.int64)
    splits = {"train": (x[:n_train], y[:n_train]), "test": (x[n_train:], y[n_train:])}
    return from_arrays(splits, [str(c) for c in range(8)], "tabular")


def make_spirals(n: int, seed: int, arms: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """``(x (n, 16) float32, y (n,) int64)`` of the ``spirals`` dataset."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, arms, n)
    r = rng.uniform(0.05, 1.0, n)
    angle = 2.5 * np.pi * r + 2 * np.pi * y / arms + rng.normal(0, 0.25, n)
    a, b = r * np.cos(angle), r * np.sin(angle)
    x = np.stack([a, b, a * b, a * a, b * b, a * r, b * r] + list(rng.normal(0, 0.5, (9, n))), axis=1)
    return x.astype(np.float32), y.astype(np.int64)


@source("spirals")
def load_spirals(src: str | None, *, n_train: int = 16384, n_test: int = 4096, seed: int = 0, **_) -> Source:
    """Generated 2-D spirals in 16 features, 5 classes (module docstring); ``src`` is ignored."""
    x, y = make_spirals(n_train + n_test, seed)
    splits = {"train": (x[:n_train], y[:n_train]), "test": (x[n_train:], y[n_train:])}
    return from_arrays(splits, [f"arm{k}" for k in range(5)], "spirals")


def make_pulses(n: int, seed: int, length: int = SIGNAL_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """``(x (n, 1, length) float32, y (n,) int64)`` of the ``pulses`` dataset: class = 2 x (count - 1)
    + shape (0 bump, 1 square)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 8, n)
    count, square = y // 2 + 1, (y % 2 == 1)[:, None]
    t = np.arange(length, dtype=np.float64)[None, :]
    x = np.zeros((n, length))
    slots = np.argsort(rng.uniform(size=(n, 4)), axis=1)               # pulse k sits in a random quarter
    quarter = length // 4
    for k in range(4):                                                  # pulse k exists where count > k
        centre = (slots[:, k:k + 1] * quarter + rng.uniform(0.25, 0.75, (n, 1)) * quarter)
        width = rng.uniform(1.5, 3.5, (n, 1))
        height = rng.uniform(0.7, 1.5, (n, 1)) * (count > k)[:, None]
        bump = np.exp(-0.5 * ((t - centre) / width) ** 2)
        step = (np.abs(t - centre) <= width).astype(np.float64)
        x += height * np.where(square, step, bump)
    offset, swing = rng.normal(0, 0.4, (n, 1)), rng.normal(0, 0.4, (n, 1))     # a slow baseline drift
    drift = offset + swing * np.sin(2 * np.pi * (t / length + rng.uniform(0, 1, (n, 1))))
    x += drift + rng.normal(0, 0.35, (n, length))
    return x[:, None, :].astype(np.float32), y.astype(np.int64)


@source("pulses")
def load_pulses(src: str | None, *, n_train: int = 16384, n_test: int = 4096, seed: int = 0, **_) -> Source:
    """Generated 1-D pulse trains, 8 classes (module docstring); ``src`` is ignored."""
    x, y = make_pulses(n_train + n_test, seed)
    splits = {"train": (x[:n_train], y[:n_train]), "test": (x[n_train:], y[n_train:])}
    names = [f"{c}x{shape}" for c in range(1, 5) for shape in ("bump", "square")]
    return from_arrays(splits, names, "pulses")
