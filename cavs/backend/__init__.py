"""Array backends behind one small interface: `numpy` (CPU) and `cupy` (GPU).

Chosen by argument, else the CAVS_BACKEND environment variable, else CuPy where a CUDA GPU is
present and NumPy otherwise.
"""
from __future__ import annotations

import functools
import os

BACKENDS = ("numpy", "cupy")


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:   # no cupy, no driver, no device: all mean "no GPU here"
        return False


def get_backend(name: str | None = None):
    name = name or os.environ.get("CAVS_BACKEND") or ("cupy" if gpu_available() else "numpy")
    if name == "numpy":
        from .numpy import NumpyBackend
        return NumpyBackend()
    if name == "cupy":
        if not gpu_available():
            raise RuntimeError("backend 'cupy' needs CuPy and a CUDA GPU; neither is usable here")
        from .cupy import CupyBackend
        return CupyBackend()
    raise ValueError(f"unknown backend {name!r}; choose one of {BACKENDS}")
