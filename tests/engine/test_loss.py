"""The CPU loss kernel (cavs/loss.py) against the NumPy version the GPU runs, on few and many classes,
with one class far ahead of the others and the last ahead of most."""
from __future__ import annotations

import numpy as np
import pytest

from cavs import loss
from cavs.backend import get_backend


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("classes", [2, 5, 39, 1000])
def test_the_cpu_kernel_gives_the_numpy_versions_loss_and_gradients(dtype, classes):
    be = get_backend("numpy")
    rng = np.random.default_rng(classes)
    n, hidden = 13, 6
    h = rng.standard_normal((n, hidden)).astype(dtype)
    w = rng.standard_normal((hidden, classes)).astype(dtype)
    b = rng.standard_normal(classes).astype(dtype)
    b[rng.integers(classes)] += 8          # one class far ahead
    b[-1] += 4                             # and the last ahead of most
    labels = rng.integers(0, classes, n)
    kernel = loss.softmax_cross_entropy(be, h, w, b, labels, True, scale=0.5)
    numpy = loss._blocked(be, h, w, b, labels, True, scale=0.5)
    rel = 1e-5 if dtype == "float32" else 1e-12
    assert kernel[0] == pytest.approx(numpy[0], rel=rel)
    for got, want, name in zip(kernel[1:], numpy[1:], ("dh", "dW", "db")):
        np.testing.assert_allclose(got, want, rtol=rel, atol=rel, err_msg=name)
    alone = loss.softmax_cross_entropy(be, h, w, b, labels, False, scale=0.5)
    assert alone[0] == pytest.approx(numpy[0], rel=rel) and alone[1:] == (None, None, None)


@pytest.mark.parametrize("classes", [7, 8, 43])
def test_the_row_max_is_found_in_every_lane_and_in_the_remainder(classes):
    """The kernel finds the row max on the logits' bits, in vector lanes and a tail: a row whose
    largest logit (100, whose exp overflows float32 unless shifted by it) sits at each position in
    turn must give the float64 loss and gradient."""
    be = get_backend("numpy")
    rng = np.random.default_rng(classes)
    logits = rng.uniform(-1, 1, (classes, classes)) + 100 * np.eye(classes)     # row p's max at column p
    h, w = np.eye(classes, dtype=np.float32), logits.astype(np.float32)
    b = np.zeros(classes, np.float32)
    labels = rng.integers(0, classes, classes)
    got = loss.softmax_cross_entropy(be, h, w, b, labels, True)
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    want_loss = -np.log(p[np.arange(classes), labels]).sum()
    p[np.arange(classes), labels] -= 1
    assert got[0] == pytest.approx(want_loss, rel=1e-5)
    np.testing.assert_allclose(got[3], p.sum(axis=0), rtol=1e-5, atol=1e-5)       # db
    np.testing.assert_allclose(got[1], p @ w.T.astype(np.float64), rtol=1e-4, atol=1e-4)   # dh


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_negative_rows_and_non_finite_logits(dtype):
    """The max on the bits orders negative logits (all of a row below zero, -0.0 against 0.0)
    as floats do; an infinite or NaN logit of either sign makes the loss NaN (the engine then
    refuses the step), never a finite number."""
    be = get_backend("numpy")
    rng = np.random.default_rng(1)
    classes = 21
    logits = -50 - rng.uniform(0, 5, (4, classes))
    logits[1, 3], logits[2] = -0.0, 0.0
    logits[2, 7] = -0.0
    h, w, b = np.eye(4, dtype=dtype), logits.astype(dtype), np.zeros(classes, dtype)
    labels = np.array([0, 3, 7, 20])
    got = loss.softmax_cross_entropy(be, h, w.copy(), b, labels, False)[0]
    z = logits - logits.max(axis=1, keepdims=True)
    want = (np.log(np.exp(z).sum(axis=1)) - z[np.arange(4), labels]).sum()
    assert got == pytest.approx(want, rel=1e-5)
    with np.errstate(invalid="ignore"):
        made_nan = np.float32(np.inf) - np.float32(np.inf)         # the CPU's own NaN: sign bit set
    for bad in (np.inf, -np.inf, np.nan, -np.nan, made_nan):
        w_bad = w.copy()
        w_bad[2, 5] = bad
        with np.errstate(invalid="ignore"):
            assert np.isnan(loss.softmax_cross_entropy(be, h, w_bad, b, labels, True)[0]), bad
