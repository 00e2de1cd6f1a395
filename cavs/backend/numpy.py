"""The CPU backend: NumPy arrays, BLAS matmuls (thread count set by the engine)."""
from __future__ import annotations

import threading

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

    def add_rows_grouped(self, dst, grouped, src, scale=1.0):
        """dst[token] += scale * (sum of src rows of that token): one sorted segment sum."""
        order, starts, unique, _ = grouped
        if len(unique):
            sums = np.add.reduceat(src[order], starts, axis=0)
            if scale != 1.0:
                sums *= scale
            dst[unique] += sums

    def stream(self, chunks):
        """Runs `chunks` (lists of closures) in order on a worker thread: the CPU's second stream.

        NumPy and BLAS release the GIL, so the worker's matmuls overlap the main thread's loop.
        Returns wait(k): blocks until chunk k is done (re-raising the worker's error, if any).
        """
        done, failure = [0], []
        cond = threading.Condition()

        def work():
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
