"""The CPU backend: NumPy arrays, BLAS matmuls (thread count set by the engine)."""
from __future__ import annotations

import numpy as np


class NumpyBackend:
    name = "numpy"
    device = "cpu"
    xp = np

    def index(self, host: np.ndarray):
        return np.ascontiguousarray(host, dtype=np.int64)

    def asarray(self, a, dtype=None):
        return np.array(a, dtype=dtype, copy=True)

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a)

    def synchronize(self):
        pass

    def take_rows(self, src, idx, out):
        np.take(src, idx, axis=0, out=out)

    def add_rows(self, dst, idx, src, unique: bool):
        if unique:
            dst[idx] += src          # buffered fancy-index add is exact when indices are distinct
        else:
            np.add.at(dst, idx, src)
