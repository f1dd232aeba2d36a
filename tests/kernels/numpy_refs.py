"""Independent NumPy computations the kernel tests compare against."""
import numpy as np


def fp16_bits_equal(actual, expected):
    """Bit-exact fp16 comparison in which any NaN equals any NaN (payloads may differ)."""
    actual = np.asarray(actual, dtype=np.float16)
    expected = np.asarray(expected, dtype=np.float16)
    assert actual.shape == expected.shape
    same = actual.view(np.uint16) == expected.view(np.uint16)
    same |= np.isnan(actual) & np.isnan(expected)
    bad = np.flatnonzero(~same)
    first = bad[:5]
    assert bad.size == 0, f"{bad.size} mismatches at {first}: {actual[first]} vs {expected[first]}"


def numpy_pack(arrays, scale):
    """Independent pack: fp32 multiply, then NumPy's (correctly rounded) cast to fp16."""
    flat = np.concatenate([np.ravel(a) for a in arrays] + [np.zeros(0, np.float32)])
    with np.errstate(over="ignore", invalid="ignore"):
        return (flat.astype(np.float32) * np.float32(scale)).astype(np.float16)


def mixed_arrays(rng, sizes, magnitude=1.0):
    return [(rng.standard_normal(n) * magnitude).astype(np.float32) for n in sizes]
