"""The GPU backend: CuPy arrays on the current CUDA device.

Every call here is documented CuPy API (tests/engine/test_gpu_standin.py runs this file on a
stand-in of exactly these calls, over NumPy, on machines without a GPU): cupy.matmul and cupy.take
with `out=`, cupyx.scatter_add / scatter_max (atomics: repeated indices add up, or keep their
maximum), and for streaming one side cupy.cuda.Stream(non_blocking=True) with events. Nothing here
reads a device value back to the host (no synchronization inside a pass) but `synchronize`.
"""
from __future__ import annotations

import cupy
import cupyx
import numpy as np


class CupyBackend:
    name = "cupy"
    device = "cuda"
    xp = cupy
    blas = "cublas"

    def __init__(self):
        self._side = None          # the second stream (streaming), created at its first use

    def set_threads(self, threads: int):
        pass

    def new_pass(self):
        pass

    def gemm(self, out, a, b, accumulate: bool = False, bias=None):
        """out = a b (+ bias), or out += a b; `out` may be a view into a concat's columns."""
        if accumulate:
            out += cupy.matmul(a, b)
            return
        if out.flags.c_contiguous:
            cupy.matmul(a, b, out=out)
        else:                    # a view into a concat's columns (engine.concat_homes)
            out[...] = cupy.matmul(a, b)
        if bias is not None:
            out += bias

    def index(self, host: np.ndarray):
        return cupy.asarray(np.ascontiguousarray(host, dtype=np.int64))

    def asarray(self, a, dtype=None):
        return cupy.array(a, dtype=dtype, copy=True)

    def to_numpy(self, a) -> np.ndarray:
        return cupy.asnumpy(a)

    def synchronize(self):
        """Waits for the current stream (the side stream's work is ordered before it by events)."""
        cupy.cuda.get_current_stream().synchronize()

    def take_rows(self, src, idx, out):
        """out[i] = src[idx[i]]."""
        cupy.take(src, idx, axis=0, out=out)

    def add_rows(self, dst, idx, src, unique: bool = False, scale: float = 1.0):
        """dst[idx[i]] += scale * src[i]; repeated indices add up. One atomic scatter-add kernel
        either way (`dst[idx] += src` for distinct indices would be three: gather, add, scatter)."""
        if scale != 1.0:
            src = src * scale
        cupyx.scatter_add(dst, idx, src)

    def max_rows(self, dst, idx, src):
        """dst[idx[i]] = max over i of src[i] for each row idx names (a segment maximum: the row's
        old value is not compared); other rows keep theirs. The rows are reset with a scatter of
        -inf through idx itself (repeated indices write the same value): cupy.unique would sort and
        read its count back to the host, a synchronization per call."""
        dst[idx] = -cupy.inf
        cupyx.scatter_max(dst, idx, src)

    def segment_rows(self, op: str, out, src, offset, parent, a: int, b: int):
        """out[v] = the sum (op "sum") or maximum ("max") of src[offset[v]:offset[v + 1]] for each
        row v in [a, b), zeros where a vertex has no edges: a fill, then one scatter kernel through
        the edges' parent rows (`offset` is on the host)."""
        ea, eb = int(offset[a]), int(offset[b])
        out[a:b].fill(0)
        if eb > ea:
            (self.add_rows if op == "sum" else self.max_rows)(out, parent[ea:eb], src[ea:eb])

    def stream(self, chunks):
        """Launches `chunks` (lists of closures) on a second CUDA stream, one event per chunk;
        wait(k) makes the current stream wait for chunk k on the device (the host does not block).
        The side stream first waits for what the current stream has queued (the inputs)."""
        main = cupy.cuda.get_current_stream()
        if self._side is None:
            self._side = cupy.cuda.Stream(non_blocking=True)
        side = self._side
        side.wait_event(main.record())
        events = []
        with side:
            for fns in chunks:
                for fn in fns:
                    fn()
                events.append(side.record())
        return lambda k: main.wait_event(events[k])
