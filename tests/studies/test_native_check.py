"""The native-kernel check `make bench` runs first (experiments/native_check.py): the engine's loss and
gradients with OpenBLAS's own kernel choice against its Haswell kernels, to float32 tolerance."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from cavs import blas
from experiments import native_check


def _npz(loss, **grads):
    buf = io.BytesIO()
    np.savez(buf, loss=np.float64(loss), **{f"grad_{k}": v for k, v in grads.items()})
    buf.seek(0)
    return np.load(buf)


def test_compare_takes_float32_noise_and_catches_a_difference():
    g = np.linspace(-1, 1, 12).reshape(3, 4)
    same = native_check.compare(_npz(1.5, W=g, b=g[0]), _npz(1.5 * (1 + 1e-7), W=g * (1 + 1e-6), b=g[0]))
    assert same["equal"] and same["worst_grad"] == "W"
    off = g.copy()
    off[1, 2] += 1e-2                                     # one entry 1% of the largest off
    different = native_check.compare(_npz(1.5, W=g, b=g[0]), _npz(1.5, W=off, b=g[0]))
    assert not different["equal"] and different["worst_grad"] == "W"
    assert native_check.compare(_npz(1.5, W=g), _npz(1.6, W=g))["equal"] is False     # the loss alone


def test_the_check_runs_both_kernel_sets_and_writes_its_record(tmp_path):
    if "openblas" not in blas.available("float32"):
        pytest.skip("NumPy's OpenBLAS is not usable here")
    r = native_check.check(tmp_path)
    assert r["verdict"] == "ok", r
    assert r["kernels"]["haswell"] == "Haswell" and r["kernels"]["native"]      # each side says what ran
    assert json.loads((tmp_path / "native_check.json").read_text())["equal"] is True
    assert "OpenBLAS forced" in native_check.describe(r)
