"""The GPU backend: CuPy arrays on the current CUDA device."""
from __future__ import annotations

import cupy
import cupyx
import numpy as np


class CupyBackend:
    name = "cupy"
    device = "cuda"
    xp = cupy
    blas = "cublas"

    def set_threads(self, threads: int):
        pass

    def new_pass(self):
        pass

    def gemm(self, out, a, b, accumulate: bool = False, bias=None):
        if accumulate:
            out += a @ b
        elif out.flags.c_contiguous:
            cupy.matmul(a, b, out=out)
        else:                    # a view into a concat's columns (engine.concat_homes)
            out[...] = a @ b
        if bias is not None and not accumulate:
            out += bias

    def index(self, host: np.ndarray):
        return cupy.asarray(np.ascontiguousarray(host, dtype=np.int64))

    def asarray(self, a, dtype=None):
        return cupy.array(a, dtype=dtype, copy=True)

    def to_numpy(self, a) -> np.ndarray:
        return cupy.asnumpy(a)

    def synchronize(self):
        cupy.cuda.get_current_stream().synchronize()

    def take_rows(self, src, idx, out):
        cupy.take(src, idx, axis=0, out=out)

    def add_rows(self, dst, idx, src, unique: bool = False, scale: float = 1.0):
        """dst[idx[i]] += scale * src[i]; repeated indices add up (atomic adds on the device)."""
        if scale != 1.0:
            src = src * scale
        if unique:
            dst[idx] += src
        else:
            cupyx.scatter_add(dst, idx, src)

    def max_rows(self, dst, idx, src):
        """dst[idx[i]] = max over i of src[i] for each row idx names (a segment maximum)."""
        dst[cupy.unique(idx)] = -cupy.inf
        cupyx.scatter_max(dst, idx, src)

    def stream(self, chunks):
        """Launches `chunks` on a second CUDA stream, one event per chunk; wait(k) makes the
        current stream wait for chunk k on the device (the host does not block)."""
        side = cupy.cuda.Stream(non_blocking=True)
        side.wait_event(cupy.cuda.get_current_stream().record())   # inputs written so far
        events = []
        with side:
            for fns in chunks:
                for fn in fns:
                    fn()
                events.append(side.record())
        main = cupy.cuda.get_current_stream()
        return lambda k: main.wait_event(events[k])
