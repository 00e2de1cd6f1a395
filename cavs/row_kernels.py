"""The CPU's row moves by index, as Numba kernels over (C-contiguous buffer, first column) pairs:
the gather of children's states into a task's rows and its dual, the scatter-add of their
gradients (positional gather(k) and children().state alike).

Why not PyTorch's index_select / index_add_ (the NumPy backend's take_rows / add_rows): on the
Tree-LSTM's rows (600 rows of 512 float32, one thread, Zen 4 EPYC) these loops take 38 and 39 us
against 44 and 54 us, and they read a row of a column view (a concat's columns, say) as well as a
whole buffer, where index_add_ into a column view takes 13x longer. Each row is sliced into a 1-D
contiguous piece so that LLVM vectorizes the copy (a strided 2-D view keeps it scalar: 2.6x
slower). A serial loop adds repeated indices one after another, as index_add_ does.
"""
from __future__ import annotations

from .fusion import compile_numba

# out[r0 + r, o0:o0 + w] = src[idx[r], s0:s0 + w]
_TAKE = """
def kernel(src, s0, idx, out, r0, o0, w):
    for r in range(idx.shape[0]):
        s = src[idx[r], s0:s0 + w]
        d = out[r0 + r, o0:o0 + w]
        for j in range(w):
            d[j] = s[j]
"""

# dst[idx[r], d0:d0 + w] += src[r0 + r, s0:s0 + w]
_ADD = """
def kernel(dst, d0, idx, src, r0, s0, w):
    for r in range(idx.shape[0]):
        d = dst[idx[r], d0:d0 + w]
        s = src[r0 + r, s0:s0 + w]
        for j in range(w):
            d[j] += s[j]
"""


def take_kernel(dtype: str):
    return compile_numba(_TAKE, dtype)


def add_kernel(dtype: str):
    return compile_numba(_ADD, dtype)
