"""The CPU backend: NumPy arrays. Matrix products go to the fastest installed library for each
product shape, chosen by measurement (cavs/blas.py: NumPy's OpenBLAS, MKL and oneDNN through
PyTorch); row gathers and scatter-adds by index are compiled loops (Numba) on C-contiguous rows,
and PyTorch's index_select / index_add_ (one pass in index order, 2-7x NumPy's take and add.at) on
other views, on NumPy memory without copies. In the engine, index_add_ took 0.7 ms for a batch's
embedding-gradient sums (600 rows of 768 float32) where the loop takes 0.2 ms.
"""
from __future__ import annotations

import functools
import os
import threading

import numpy as np

from .. import blas


@functools.lru_cache(maxsize=None)
def _row_kernels():
    import numba

    @numba.njit(cache=True, nogil=True)
    def segment_sum(out, src, offset, a, b):
        for v in range(a, b):
            for j in range(out.shape[1]):
                out[v, j] = 0
            for e in range(offset[v], offset[v + 1]):
                for j in range(out.shape[1]):
                    out[v, j] += src[e, j]

    @numba.njit(cache=True, nogil=True)
    def segment_max(out, src, offset, a, b):
        for v in range(a, b):
            lo, hi = offset[v], offset[v + 1]
            for j in range(out.shape[1]):
                out[v, j] = 0
                if hi > lo:
                    out[v, j] = src[lo, j]
            for e in range(lo + 1, hi):
                for j in range(out.shape[1]):
                    x = src[e, j]
                    if x > out[v, j] or x != x:        # once NaN, stays NaN (x > NaN is false)
                        out[v, j] = x

    # out[i] = src[idx[i]] and dst[idx[i]] += scale * src[i] on C-contiguous arrays: each row a
    # 1-D contiguous piece, so LLVM vectorizes the copy (a serial loop: repeated indices add up)
    @numba.njit(cache=True, nogil=True)
    def take(src, idx, out):
        for i in range(idx.shape[0]):
            s, d = src[idx[i]], out[i]
            for j in range(d.shape[0]):
                d[j] = s[j]

    @numba.njit(cache=True, nogil=True)
    def add(dst, idx, src, scale):
        for i in range(idx.shape[0]):
            d, s = dst[idx[i]], src[i]
            for j in range(d.shape[0]):
                d[j] += scale * s[j]

    return {"sum": segment_sum, "max": segment_max, "take": take, "add": add}


class NumpyBackend:
    name = "numpy"
    device = "cpu"
    xp = np

    def __init__(self):
        self._torch = blas._torch()        # None without PyTorch
        # until the engine chooses per product (use_gemm), NumPy's own matmul
        self.gemm = blas.make("numpy").gemm
        self.flush_denormals()

    def use_gemm(self, gemm: "blas.Gemm") -> None:
        """Routes every product through `gemm` (blas.choose: a library per product shape); with
        several threads, its pool gets them and the other pool one."""
        self.gemm = gemm
        if gemm.pool is not None:
            blas.set_pool_threads(gemm.pool, gemm.threads)

    @property
    def blas(self) -> str:
        """The library of the products ('numpy', or blas.Gemm.name: the choice and its pool now)."""
        return self.gemm.name if isinstance(self.gemm, blas.Gemm) else "numpy"

    def new_pass(self):
        """The parameters may have changed since the last pass: drop what was derived from them."""
        if isinstance(self.gemm, blas.Gemm):
            self.gemm.new_pass()

    def flush_denormals(self):
        """Sets flush-to-zero and denormals-are-zero on this thread, as TensorFlow does on the
        CPU: gradients that shrink through deep trees reach float32 denormals, on which the
        matmuls ran about 4x slower (Tree-LSTM h = 512). Changes values below 1.2e-38 only."""
        if os.environ.get("CAVS_FTZ", "1").strip().lower() in ("0", "false", "off", "no", ""):
            return                 # the harness's switch: the same numeric environment for every system
        if self._torch is not None:
            self._torch.set_flush_denormal(True)

    def set_threads(self, threads: int):
        if self._torch is not None:
            self._torch.set_num_threads(threads)

    def index(self, host: np.ndarray):
        return np.ascontiguousarray(host, dtype=np.int64)

    def asarray(self, a, dtype=None):
        return np.array(a, dtype=dtype, copy=True)

    def parameter(self, a, dtype=None):
        """A copy of `a` laid out as blas.measure lays out weights (blas.weight_array)."""
        a = np.asarray(a, dtype=dtype)
        out = blas.weight_array(a.shape, a.dtype)
        np.copyto(out, a)
        return out

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a)

    def synchronize(self):
        pass

    def take_rows(self, src, idx, out):
        """out[i] = src[idx[i]]."""
        if src.flags.c_contiguous and out.flags.c_contiguous and src.dtype == out.dtype:
            _row_kernels()["take"](src, idx, out)
            return
        torch = self._torch
        if torch is not None and out.flags.c_contiguous:   # 2-3x NumPy's take on wide rows
            t = torch.from_numpy
            torch.index_select(t(src), 0, t(idx), out=t(out))
        else:
            np.take(src, idx, axis=0, out=out)

    def add_rows(self, dst, idx, src, unique: bool = False, scale: float = 1.0):
        """dst[idx[i]] += scale * src[i]; repeated indices add up (the scatter of child-state
        gradients, the embedding gradient and its SGD update)."""
        if dst.flags.c_contiguous and src.flags.c_contiguous and dst.dtype == src.dtype:
            _row_kernels()["add"](dst, idx, src, dst.dtype.type(scale))
            return
        torch = self._torch
        if torch is not None:     # one pass in index order, 5-7x faster than NumPy's grouped sums
            t = torch.from_numpy
            t(dst).index_add_(0, t(idx), t(src), alpha=scale)
            return
        if scale != 1.0:
            src = src * scale
        if unique:
            dst[idx] += src          # buffered fancy-index add is exact when indices are distinct
        else:
            np.add.at(dst, idx, src)

    def max_rows(self, dst, idx, src):
        """dst[idx[i]] = max over i of src[i], for each row that idx names (its old value is not
        compared: a segment maximum); other rows keep theirs."""
        torch = self._torch
        if torch is not None:
            t = torch.from_numpy
            index = t(idx)[:, None].expand(-1, src.shape[1])
            t(dst).scatter_reduce_(0, index, t(src), "amax", include_self=False)
            return
        rows = np.unique(idx)
        dst[rows] = -np.inf
        np.maximum.at(dst, idx, src)

    def segment_rows(self, op: str, out, src, edges, a: int, b: int):
        """out[v] = the sum (op "sum") or maximum ("max") of src[offset[v]:offset[v + 1]] for each
        row v in [a, b): a vertex's edges are contiguous, sorted by parent. Zeros where a vertex has
        no edges; a maximum over a NaN is NaN. One compiled pass over the rows (the sums in edge
        order, as add_rows adds them): a third of a fill and an index_add_ on a task's edges
        (Tree-LSTM child-sum, 160 edges x 256). `edges`: memory.EdgePlan (its host offsets)."""
        _row_kernels()[op](out, src, edges.offset, a, b)

    def stream(self, chunks):
        """Runs `chunks` (lists of closures) in order on a worker thread: the CPU's second stream.

        NumPy and BLAS release the GIL, so the worker's matmuls overlap the main thread's loop.
        Returns wait(k): blocks until chunk k is done (re-raising the worker's error, if any).
        """
        done, failure = [0], []
        cond = threading.Condition()

        def work():
            self.flush_denormals()           # per thread (MXCSR)
            try:
                for fns in chunks:
                    for fn in fns:
                        fn()
                    with cond:
                        done[0] += 1
                        cond.notify_all()
            except BaseException as e:   # handed to the main thread at its next wait
                with cond:
                    failure.append(e)
                    cond.notify_all()

        threading.Thread(target=work, daemon=True, name="cavs-eager-stream").start()

        def wait(k):
            with cond:
                cond.wait_for(lambda: done[0] > k or failure)
            if failure:
                raise failure[0]
        return wait

    def trail(self, chunks):
        """Runs `chunks` on a worker thread, chunk k once the caller said ready(k) (the loop has
        finished its tasks); finish() waits for all of them (re-raising the worker's error)."""
        ready, failure = [0], []
        cond = threading.Condition()

        def work():
            self.flush_denormals()
            try:
                for k, fns in enumerate(chunks):
                    with cond:
                        cond.wait_for(lambda: ready[0] > k)
                    for fn in fns:
                        fn()
            except BaseException as e:
                failure.append(e)

        worker = threading.Thread(target=work, daemon=True, name="cavs-lazy-stream")
        worker.start()

        class Trail:
            def ready(self, k):
                with cond:
                    ready[0] = max(ready[0], k + 1)
                    cond.notify_all()

            def finish(self):
                self.ready(len(chunks) - 1)
                worker.join()
                if failure:
                    raise failure[0]
        return Trail()
