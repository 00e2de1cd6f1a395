"""The loss outside F: softmax cross-entropy of `h Wout + bout` on the pushed outputs of the
labelled vertices, summed over the batch (docs/workloads.md), and its gradient, in one batched call.

The three products (logits = h W, dh = dlogits W^T, dW = h^T dlogits) are GEMMs through the
backend. Between them, on the CPU, one generated Numba kernel walks the logits row by row:
the bias add, the row max (on the logits' bits, which vectorizes), the shifted exponentials and
their sum, and, for training, the gradient (p - onehot) * scale written over the logits (where
both backward products read it) and summed into db. A row (40 KB at 10,000 classes)
stays in the core's L2 cache across the passes, so the logits cross memory once each way,
where the NumPy version made about ten passes over 1 MiB blocks. float32 takes exp from a
vectorizing polynomial (Cephes' expf: 1-2 ulp; libm's scalar expf keeps LLVM from
vectorizing the loop); float64 calls libm's exp. On the GPU the NumPy-style version runs
on CuPy arrays.
"""
from __future__ import annotations

import functools
import threading

import numpy as np

# The max-shifted logits are floored at -60 before exp: exp(-60) / 10^4 classes is still a
# normal float32, so no probability becomes a denormal, which would make the CPU's matmuls on
# them ~10x slower (what flush-to-zero avoids in TensorFlow). Probabilities change by < 1e-26.
FLOOR = -60.0

# exp(t) for t in [FLOOR, 0]: t = n ln2 + q with n = round(t / ln2) (|q| <= ln2 / 2), exp(q) from
# Cephes' degree-7 polynomial, 2^n from its exponent bits (a scalar bit view, which vectorizes).
_EXP32 = """
            n = np.int32(t * F(1.44269504088896341) - F(0.5))
            fn = F(n)
            q = t - fn * F(0.693359375)
            q = q + fn * F(2.12194440e-4)
            p = F(1.9875691500e-4)
            p = p * q + F(1.3981999507e-3)
            p = p * q + F(8.3334519073e-3)
            p = p * q + F(4.1665795894e-2)
            p = p * q + F(1.6666665459e-1)
            p = p * q + F(5.0000001201e-1)
            e = (p * q * q + q + F(1.0)) * np.int32((n + np.int32(127)) << np.int32(23)).view(np.float32)
"""
_EXP64 = """
            e = math.exp(t)
"""
# Per row, three passes over the row while it sits in L2: (1) the bias added and the row's max,
# as the max of the logits' bits read as integers with the negative ones' magnitude bits flipped,
# so that integer order is float order (LLVM vectorizes an integer max reduction, not a float one,
# whose NaN rules stop it); (2) the shifted exponentials and their sum; (3) for training, the
# gradient. A NaN orders above +inf (sign bit clear) or below -inf (sign bit set, as x86 makes
# them), so the greatest and the least key find any; the checks are on the bits because fastmath
# lets LLVM assume that no float is NaN.
_KERNEL = """
def kernel(z, b, labels, scale, want_grad, db):
    n_rows, c = z.shape
    total = 0.0
    for r in range(n_rows):
        row = z[r]
        hi = {I}(-1) ^ {I}({SIGN})
        lo = {I}({SIGN})
        for j in range(c):
            v = row[j] + b[j]
            row[j] = v
            x = F(v).view({I})
            key = {I}(x ^ ((x >> {I}({SHIFT})) & {I}({SIGN})))
            hi = max(hi, key)
            lo = min(lo, key)
        hi = {I}(hi ^ ((hi >> {I}({SHIFT})) & {I}({SIGN})))      # the keys back to the floats' bits
        lo = {I}(lo ^ ((lo >> {I}({SHIFT})) & {I}({SIGN})))
        if (hi & {I}({SIGN})) >= {I}({INF}) or (lo & {I}({SIGN})) > {I}({INF}):
            return math.nan            # overflowed logits (inf, NaN): no loss to report (the engine refuses the step)
        m = hi.view(F)
        y = labels[r]
        picked = row[y] - m
        s = F(0.0)
        for j in range(c):
            t = max(row[j] - m, F({floor}))
{exp}
            row[j] = e
            s += e
        total += max(math.log(s) - picked, 0.0)      # a cross-entropy, never below 0 by rounding
        if want_grad:
            k = F(scale) / s
            for j in range(c):
                g = row[j] * k
                row[j] = g
                db[j] += g
            row[y] -= F(scale)
            db[y] -= F(scale)
    return total
"""


@functools.lru_cache(maxsize=None)
def _kernel(dtype: str):
    from .fusion import compile_numba
    exp = _EXP32 if dtype == "float32" else _EXP64
    bits = np.dtype(dtype).itemsize * 8
    inf = np.array(np.inf, dtype=dtype).view(f"i{bits // 8}")       # +inf's bits: the exponent all ones
    return compile_numba(_KERNEL.format(floor=FLOOR, exp=exp.strip("\n"), I=f"np.int{bits}", SHIFT=bits - 1,
                                        SIGN=hex(2 ** (bits - 1) - 1), INF=hex(int(inf))), dtype)


def warm_up(dtype: str) -> None:
    """Loads (or compiles) the CPU loss kernel now rather than in the first step."""
    from numba import types
    f = getattr(types, dtype)
    _kernel(dtype).compile((types.Array(f, 2, "C"), types.Array(f, 1, "C"), types.Array(types.int64, 1, "C"),
                            types.float64, types.boolean, types.Array(f, 1, "C")))


_local = threading.local()


def _logits_buffer(n: int, classes: int, dtype) -> np.ndarray:
    """A reused (n, classes) buffer: allocating 56 MB afresh per batch (Var-LSTM) costs the
    first touch of every page each time."""
    size = n * classes
    buf = getattr(_local, "logits", None)
    if buf is None or buf.dtype != dtype or buf.size < size:
        buf = _local.logits = np.empty(max(size, int(size * 1.25)), dtype=dtype)
    return buf[:size].reshape(n, classes)


def softmax_cross_entropy(be, h, w, b, labels, want_grad: bool, scale: float = 1.0, *,
                          dh_out=None, dw_acc=None, db_acc=None):
    """Returns (scale * loss, dh, dW, db) with the gradients of the scaled loss; the gradients
    are None when want_grad is False. Optionally the gradients go where their reader wants
    them: dh written into `dh_out`, dW and db added into `dw_acc` and `db_acc` (the returned
    dW / db are then those arrays)."""
    if be.device != "cpu" or h.dtype.name not in ("float32", "float64"):
        return _blocked(be, h, w, b, labels, want_grad, scale, dh_out, dw_acc, db_acc)
    n, classes = h.shape[0], w.shape[1]
    logits = _logits_buffer(n, classes, h.dtype)
    be.gemm(logits, h, w)
    db = np.zeros_like(b) if db_acc is None else db_acc
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    loss = scale * _kernel(h.dtype.name)(logits, np.ascontiguousarray(b), labels, float(scale), bool(want_grad), db)
    if not want_grad:
        return loss, None, None, None
    return (loss, *_backward_products(be, h, w, logits, dh_out, dw_acc), db)


def _backward_products(be, h, w, dlogits, dh_out, dw_acc):
    """dh = dlogits W^T and dW = h^T dlogits (or dw_acc += h^T dlogits), as GEMMs."""
    dh = be.xp.empty_like(h) if dh_out is None else dh_out
    be.gemm(dh, dlogits, w.T)
    if dw_acc is None:
        dw = be.xp.empty_like(w)
        be.gemm(dw, h.T, dlogits)
    else:
        dw = dw_acc
        be.gemm(dw, h.T, dlogits, accumulate=True)
    return dh, dw


# The GPU's version (and any array library's): elementwise passes over all rows at once.
def _blocked(be, h, w, b, labels, want_grad: bool, scale: float, dh_out=None, dw_acc=None, db_acc=None):
    xp = be.xp
    n, classes = h.shape[0], w.shape[1]
    logits = xp.empty((n, classes), dtype=h.dtype)
    be.gemm(logits, h, w)
    rows = xp.arange(n)
    z, y = logits, labels
    z += b
    z -= z.max(axis=1, keepdims=True)
    picked = z[rows, y]
    xp.maximum(z, FLOOR, out=z)
    xp.exp(z, out=z)
    total = z.sum(axis=1)
    loss = float(xp.maximum(xp.log(total) - picked, 0).sum()) * scale     # NaN (overflow) stays NaN
    if not want_grad:
        return loss, None, None, None
    z /= total[:, None]                # softmax probabilities
    z[rows, y] -= 1.0                  # d loss / d logits
    if scale != 1.0:
        z *= scale
    if db_acc is None:
        db = z.sum(axis=0)
    else:
        db = db_acc
        db += z.sum(axis=0)
    return (loss, *_backward_products(be, h, w, logits, dh_out, dw_acc), db)


def softmax(be, h, w, b):
    """Row-wise softmax of `h W + b` (predictions), with the same max shift as the loss."""
    xp = be.xp
    z = xp.empty((h.shape[0], w.shape[1]), dtype=h.dtype)
    be.gemm(z, h, w)
    z += b
    z -= z.max(axis=1, keepdims=True)
    xp.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z
