"""The GPU backend: CuPy arrays on the current CUDA device.

Every call here is documented CuPy API (tests/engine/test_gpu_standin.py runs this file on a
stand-in of exactly these calls, over NumPy, on machines without a GPU): cupy.matmul and cupy.take
with `out=`, cupyx.scatter_add / scatter_max (atomics: repeated indices add up, or keep their
maximum; a segment maximum uses neither, see `_segment_max`), and for streaming one side cupy.cuda.Stream(non_blocking=True) with events. Nothing here
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

    parameter = asarray

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
        read its count back to the host, a synchronization per call. In float64 the maximum may be
        rounded through float32 (CuPy 14.2): fine for the softmax's shift, its one use."""
        dst[idx] = -cupy.inf
        cupyx.scatter_max(dst, idx, src)

    def segment_rows(self, op: str, out, src, edges, a: int, b: int):
        """out[v] = the sum (op "sum") or maximum ("max") of src[offset[v]:offset[v + 1]] for each
        row v in [a, b), zeros where a vertex has no edges (`edges`: memory.EdgePlan, the edges
        sorted by parent). The sum is a fill and one scatter-add through the edges' parent rows."""
        ea, eb = int(edges.offset[a]), int(edges.offset[b])
        if op == "max" and eb > ea:
            self._segment_max(out, src[ea:eb], edges, a, b)
            return
        out[a:b].fill(0)
        if eb > ea:
            self.add_rows(out, edges.parent[ea:eb], src[ea:eb])

    def _segment_max(self, out, src, edges, a: int, b: int):
        """The maximum of each vertex's edges, exactly one of its edge values (its gradient finds the
        edges equal to it): no atomics (CuPy 14.2's cupyx.scatter_max and cupy.maximum.at round
        float64 through float32, measured on an H200: results/gpu/notes.md), but log2(largest degree) rounds of m[e] = max(m[e],
        m[e + s]) within a parent's edges, s = 1, 2, 4, ..., after which each vertex's first edge
        holds the maximum over its edges. A NaN edge makes it NaN. No value is read back to the
        host: the degrees come from the host's offsets, the first edges from their device copy."""
        ea = int(edges.offset[a])
        m = src.copy()
        parent = edges.parent[ea:ea + len(m)]
        widest = int(np.diff(edges.offset[a:b + 1]).max())
        s = 1
        while s < widest:
            same = (parent[s:] == parent[:-s])[:, None]
            cupy.maximum(m[:-s], cupy.where(same, m[s:], m[:-s]), out=m[:-s])
            s *= 2
        first = edges.first[a:b + 1] - ea
        has_edges = (first[1:] > first[:-1])[:, None]
        rows = cupy.minimum(first[:-1], len(m) - 1)          # (a vertex without edges: any row, masked)
        out[a:b] = cupy.where(has_edges, cupy.take(m, rows, axis=0), 0)

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
