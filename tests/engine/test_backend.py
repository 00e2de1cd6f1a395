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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_rows_reduce_each_vertexs_edges(dtype):
    """segment_rows against a loop over each vertex's edges (gpu_cases.check_segment_rows), and
    its sums bit for bit as add_rows adds them, in edge order."""
    from types import SimpleNamespace
    from tests.engine import gpu_cases
    be = cpu.NumpyBackend()
    gpu_cases.check_segment_rows(be, np, dtype)
    rng = np.random.default_rng(2)
    degree = np.array([2, 0, 1, 5, 0, 3, 4])
    offset = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    parent = np.repeat(np.arange(len(degree)), degree).astype(np.int64)
    src = rng.standard_normal((len(parent), 9)).astype(dtype)
    out, ref = np.full((7, 9), 7.0, dtype), np.full((7, 9), 7.0, dtype)
    be.segment_rows("sum", out, src, SimpleNamespace(offset=offset, parent=parent, first=offset), 1, 6)
    ref[1:6] = 0
    be.add_rows(ref, parent[offset[1]:offset[6]], src[offset[1]:offset[6]])
    np.testing.assert_array_equal(out, ref)

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "column view"])
def test_row_moves_by_index_equal_numpy(dtype, layout):
    """take_rows and add_rows (compiled loops on C-contiguous rows, PyTorch or NumPy on views)
    against NumPy's take and add.at: repeated indices add up, in index order, scaled."""
    rng = np.random.default_rng(5)
    be = cpu.NumpyBackend()
    table = rng.standard_normal((11, 13)).astype(dtype)
    idx = np.array([3, 0, 3, 10, 7, 3, 0], dtype=np.int64)
    wide = rng.standard_normal((len(idx), 20)).astype(dtype)
    src = wide[:, 2:15] if layout == "column view" else np.ascontiguousarray(wide[:, 2:15])
    out = np.full((len(idx), 13), 7.0, dtype)
    be.take_rows(table, idx, out)
    np.testing.assert_array_equal(out, table[idx])
    for scale in (1.0, -0.25):
        dst, ref = table.copy(), table.copy()
        be.add_rows(dst, idx, src, scale=scale)
        np.add.at(ref, idx, (dtype(scale) * src).astype(dtype))
        np.testing.assert_allclose(dst, ref, rtol=1e-6 if dtype == np.float32 else 1e-15)
    empty = np.empty((0, 13), dtype)
    be.take_rows(table, idx[:0], empty)
    dst = table.copy()
    be.add_rows(dst, idx[:0], empty)
    np.testing.assert_array_equal(dst, table)
