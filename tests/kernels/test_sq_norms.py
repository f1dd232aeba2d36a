"""multi_tensor_sq_norms reference against NumPy float64 sums."""
import numpy as np
import pytest
import torch

from hpctrain import kernels

from .numpy_refs import mixed_arrays


def numpy_norms(arrays):
    per = np.array([np.sum(np.square(a, dtype=np.float64)) for a in arrays])
    return per, np.sqrt(per.sum())


@pytest.mark.parametrize("sizes", [[1], [7], [1001], [(1 << 20) + 3], [0, 5, 0],
                                   [3, 1000, 64, 131_073, 1, 250_000]])
def test_matches_float64(sizes):
    arrays = mixed_arrays(np.random.default_rng(len(sizes)), sizes, magnitude=3.0)
    per, norm = kernels.multi_tensor_sq_norms([torch.from_numpy(a) for a in arrays])
    want_per, want_norm = numpy_norms(arrays)
    assert per.dtype == torch.float32 and per.shape == (len(arrays),)
    assert norm.dtype == torch.float32 and norm.shape == ()
    np.testing.assert_allclose(per.numpy(), want_per, rtol=1e-5)
    np.testing.assert_allclose(float(norm), want_norm, rtol=1e-5)


def test_known_values():
    per, norm = kernels.multi_tensor_sq_norms([torch.tensor([3.0, 4.0]), torch.ones(2, 2) * 0.5])
    assert per.tolist() == [25.0, 1.0]
    assert float(norm) == pytest.approx(26**0.5)


def test_empty_list():
    per, norm = kernels.multi_tensor_sq_norms([])
    assert per.shape == (0,) and float(norm) == 0.0


def test_parameters_with_grad_and_numpy_inputs():
    w = torch.nn.Parameter(torch.full((10,), 2.0))
    per, norm = kernels.multi_tensor_sq_norms([w])
    assert float(per[0]) == 40.0 and not per.requires_grad
    per_np, norm_np = kernels.multi_tensor_sq_norms([np.full(4, 0.5, np.float32)])
    assert isinstance(per_np, np.ndarray) and float(per_np[0]) == 1.0 and float(norm_np) == 1.0


def test_non_finite_propagates():
    per, norm = kernels.multi_tensor_sq_norms([torch.tensor([1.0, float("inf")]), torch.ones(3)])
    assert np.isinf(per[0].item()) and per[1].item() == 3.0 and np.isinf(norm.item())


def test_fp16_input_rejected():
    with pytest.raises(TypeError):
        kernels.multi_tensor_sq_norms([torch.ones(3, dtype=torch.float16)])
