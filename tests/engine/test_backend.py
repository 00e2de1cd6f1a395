"""The CPU backend's matmuls (MKL through PyTorch where installed) against NumPy, on the views the
engine passes: row blocks of wider buffers, transposed weights, accumulation."""
import numpy as np
import pytest

from cavs.backend import numpy as cpu


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 7, 130])
def test_gemm_equals_numpy_on_strided_views(dtype, transposed, rows):
    rng = np.random.default_rng(0)
    be = cpu.NumpyBackend()
    w = rng.standard_normal((96, 40)).astype(dtype)
    b = w.T if transposed else w                                                # (k, n)
    k, n = b.shape
    a = rng.standard_normal((rows, k + 9)).astype(dtype)[:, 3:3 + k]           # columns of a wider buffer
    out_buf = np.full((rows, n + 5), 7.0, dtype=dtype)
    out = out_buf[:, 2:2 + n]
    tol = 1e-5 if dtype == np.float32 else 1e-12
    be.gemm(out, a, b)
    np.testing.assert_allclose(out, a @ b, rtol=tol, atol=tol * 100)
    be.gemm(out, a, b, accumulate=True)
    np.testing.assert_allclose(out, 2 * (a @ b), rtol=tol, atol=tol * 100)
    assert (out_buf[:, :2] == 7).all() and (out_buf[:, 2 + n:] == 7).all()   # other columns untouched


def test_blas_choice_is_reported():
    assert cpu.NumpyBackend().blas in ("mkl (torch)", "numpy")
