"""The CPU's matrix products: every installed GEMM library behind one call, and for each product
shape the fastest of them, chosen by measurement once per machine and cached (as cuDNN's benchmark
mode and FFTW's wisdom do).

Why measure: which library is fastest depends on the CPU and on the shape, by factors of two. On
a 2-core family-26 AMD EPYC (AVX-512), one thread, float32 (GFLOP/s, rows x inner x outer):

    shape              openblas (Haswell kernels)  openblas (native)   mkl   onednn
    8 x 256 x 1280                 54                     75            56     127
    16 x 512 x 2560                81                    116            79     221
    64 x 1024 x 2560               94                    178            90     241
    1400 x 256 x 10000            121                    237            93     122

MKL takes its AVX2 path on AMD; OpenBLAS runs the kernels of the CPU it detects unless
OPENBLAS_CORETYPE names others (these VMs set Haswell for old OpenBLAS builds); oneDNN (the
library TensorFlow's matmul uses, here PyTorch's copy of it) is fastest on the loop's small row
counts with its weights packed, OpenBLAS on the output layer's long products.

The libraries (each only where installed and usable for the dtype):
  openblas  NumPy's own OpenBLAS, called through its CBLAS symbol (ctypes): strided operands and
            outputs as they are, beta = 1 for accumulation, no temporaries
  mkl       torch.mm / torch.addmm on NumPy memory (torch.from_numpy: no copies)
  onednn    torch.ops.mkldnn._linear_pointwise with the weight packed once per pass (float32 only;
            products whose right operand is a parameter, x W or dy W^T)
  dnnl      oneDNN's own dnnl_sgemm (float32), called as OpenBLAS's CBLAS is
  dnnl-t    dy W^T through dnnl_sgemm on a row-major copy of W^T made once per pass (float32)

Weights sit at one alignment, WEIGHT_OFFSET bytes past a 64-byte boundary: the engine's parameters,
dnnl-t's copies and the weights `measure` times alike (weight_array). dnnl_sgemm takes another path
by it: on the Zen 3 EPYC, x W with 64 rows ran 1.4-1.8x faster with W 16 bytes past the boundary than
on it, and with 4-16 rows 1.4x slower; with NumPy's allocator choosing, the measured choice was the
wrong one in place.

A product is keyed by (layout, row class, inner, outer): layout "nn" is x W, "nt" dy W^T, "tn"
x^T dy (a parameter gradient, whose inner dimension is the rows); the row class is the power of
two at or below the varying dimension (capped at MAX_ROW_CLASS). choose() times each library on
each key of a model (the engine lists them from F, dF and the head) at two row counts inside its
class and keeps the mean (timed_rows; the libraries interleaved, _time_interleaved): a library's
rate can change 2-3x within a class (on the Zen 3 EPYC, dnnl_sgemm ran x W, W 256 x 1024, at
28 GFLOP/s on 16 rows and 73 on 31), and timing a class at its first row count chose libraries that
ran most of the class slower. Their times persist in
<kernel cache>/blas-<key>.json, keyed by the CPU's generation, the libraries' versions, the
kernel set OpenBLAS runs, the thread count and the dtype. A file that cannot be read is ignored
with a warning and measured again.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np

LIBRARIES = ("openblas", "mkl", "onednn", "dnnl", "dnnl-t")
DNNL_DISTRIBUTION = "onednn-cpu-gomp"
CHOICES = ("auto",) + LIBRARIES + ("numpy",)      # "numpy": np.matmul, NumPy's own call path
MAX_ROW_CLASS = 1024           # larger products run at the rate of this class (measured: within 5%)
ROW_CLASSES = tuple(1 << k for k in range(MAX_ROW_CLASS.bit_length()))     # 1, 2, 4, ..., 1024
MIN_TIMED_S = 0.002            # a measurement repeats the product until it took this long
ROUNDS = 4                     # ... in each of this many rounds, every library once a round
LONG_CALL_S = 0.025            # a product whose every library's call takes this long: two samples
# products a pass makes with one weight in the task loop, sharing its packing (10-30 per batch on
# the paper's trees and sentences; the lower end, so that packing is not undercharged). A product
# of a whole-batch phase (eager, lazy, the head) is one per pass, and pays its packing alone.
LOOP_USES = 12
_CBLAS_ROW_MAJOR, _CBLAS_NO_TRANS, _CBLAS_TRANS = 101, 111, 112
WEIGHT_OFFSET = 16             # bytes past a 64-byte boundary where every weight starts (module docstring)


def weight_array(shape, dtype) -> np.ndarray:
    """An empty array for a weight (a parameter, or a measured product's weight operand), its data
    WEIGHT_OFFSET bytes past a 64-byte boundary, so that a product runs in place at the rate it was
    measured at: some libraries take another path by the weight's alignment, and NumPy's
    allocator leaves that to chance."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + 64 + WEIGHT_OFFSET, dtype=np.uint8)
    start = -raw.ctypes.data % 64 + WEIGHT_OFFSET
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def row_class(rows: int) -> int:
    return min(MAX_ROW_CLASS, 1 << max(0, int(rows).bit_length() - 1))


def timed_rows(row_class: int) -> tuple[int, ...]:
    """The row counts a class is timed at: two inside it, a quarter in from each end and off the
    powers of two (81 and 111 for 64-127), whose mean time stands for the class. Any one count
    misleads: at 96 rows OpenBLAS's kernels tile exactly and ran x W (W 512 x 1280) as fast as
    dnnl_sgemm, which was 5-15% faster from 64 to 127 rows but there. The last class, which holds
    every larger product, is timed at one count a quarter past its start."""
    if row_class >= MAX_ROW_CLASS:
        return (row_class + row_class // 4 + 1,)
    return tuple(sorted({min(2 * row_class - 1, row_class + row_class // 4 + 1),
                         max(row_class, 2 * row_class - row_class // 4 - 1)}))


def layout_of(a, b) -> str | None:
    """'nn' (b row-major), 'nt' (b a transposed row-major matrix), 'tn' (a transposed), or None."""
    if a.strides[-1] == a.itemsize and b.strides[-1] == b.itemsize:
        return "nn"
    if a.strides[-1] == a.itemsize and b.strides[0] == b.itemsize:
        return "nt"
    if a.strides[0] == a.itemsize and b.strides[-1] == b.itemsize:
        return "tn"
    return None


def key_of(layout: str, a, b) -> tuple:
    """The measured shape class of out = a @ b (see the module docstring)."""
    varying = a.shape[1] if layout == "tn" else a.shape[0]
    return layout, row_class(varying), (a.shape[0] if layout == "tn" else a.shape[1]), b.shape[1]


# ---------------------------------------------------------------- the libraries

class NumpyMatmul:
    """np.matmul (NumPy's own call path to its BLAS); accumulation and bias in extra passes."""
    name = "numpy"

    def supports(self, dtype, layout) -> bool:
        return True

    def gemm(self, out, a, b, accumulate=False, bias=None):
        if accumulate:
            out += a @ b
        else:
            np.matmul(a, b, out=out)
            if bias is not None:
                out += bias


@functools.lru_cache(maxsize=None)
def _openblas_gemm():
    """{dtype name: (cblas ?gemm function, index type)} of NumPy's OpenBLAS, or None."""
    try:
        from threadpoolctl import threadpool_info
        libs = [i for i in threadpool_info() if i.get("internal_api") == "openblas"
                and "numpy" in i.get("filepath", "")]
        if not libs:
            return None
        lib = ctypes.CDLL(libs[0]["filepath"])
    except (ImportError, OSError):
        return None
    found = {}
    for dtype, letter in (("float32", "s"), ("float64", "d")):
        for prefix in ("scipy_", ""):
            for suffix, index in (("64_", ctypes.c_int64), ("", ctypes.c_int)):
                fn = getattr(lib, f"{prefix}cblas_{letter}gemm{suffix}", None)
                if fn is None:
                    continue
                real = ctypes.c_float if dtype == "float32" else ctypes.c_double
                fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, index, index, index, real, ctypes.c_void_p,
                               index, ctypes.c_void_p, index, real, ctypes.c_void_p, index]
                fn.restype = None
                found[dtype] = fn
                break
            if dtype in found:
                break
    return found or None


class StridedGemm:
    """C = A B (+ bias), or C += A B, on strided row-major views through a BLAS-like library call
    (`_call`): beta = 1 to accumulate, no temporaries. Operands it cannot pass as they are (another
    dtype, a view strided both ways) go through np.matmul."""

    def __init__(self):
        self._fallback = NumpyMatmul()

    def _fn(self, dtype):
        """The library's call for `dtype`, or None."""
        raise NotImplementedError

    def gemm(self, out, a, b, accumulate=False, bias=None):
        fn = self._fn(out.dtype)
        size = out.itemsize
        if fn is None or out.strides[-1] != size or a.dtype != out.dtype or b.dtype != out.dtype:
            return self._fallback.gemm(out, a, b, accumulate, bias)
        ta, lda = _operand(a, size)
        tb, ldb = _operand(b, size)
        if ta is None or tb is None:
            return self._fallback.gemm(out, a, b, accumulate, bias)
        m, k = a.shape
        n = b.shape[1]
        beta = 1.0
        if not accumulate:
            if bias is not None:
                out[...] = bias
            else:
                beta = 0.0
        if m == 0 or n == 0:
            return
        if k == 0:                # nothing to add (oneDNN would leave C as it was, not scale it by beta)
            if beta == 0.0:
                out[...] = 0
            return
        ldc = max(out.strides[0] // size, n) if m > 1 else n
        self._call(fn, ta, tb, m, n, k, a.ctypes.data, lda, b.ctypes.data, ldb, beta, out.ctypes.data, ldc)


class OpenBlas(StridedGemm):
    """NumPy's OpenBLAS through CBLAS."""
    name = "openblas"

    def __init__(self):
        super().__init__()
        self._fns = _openblas_gemm() or {}

    def supports(self, dtype, layout) -> bool:
        return np.dtype(dtype).name in self._fns

    def _fn(self, dtype):
        return self._fns.get(dtype.name)

    @staticmethod
    def _call(fn, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
        fn(_CBLAS_ROW_MAJOR, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc)


def _operand(x, size):
    """(CBLAS transpose flag, leading dimension) of a row-major or transposed row-major view."""
    rows, cols = x.shape
    if x.strides[-1] == size and (rows <= 1 or x.strides[0] >= cols * size):
        return _CBLAS_NO_TRANS, max(x.strides[0] // size if rows > 1 else cols, cols, 1)
    if x.strides[0] == size and (cols <= 1 or x.strides[1] >= rows * size):
        return _CBLAS_TRANS, max(x.strides[1] // size if cols > 1 else rows, rows, 1)
    return None, None


@functools.lru_cache(maxsize=None)
def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


class Mkl:
    """torch.mm / torch.addmm (MKL in PyTorch's CPU wheels) on NumPy memory, no copies."""
    name = "mkl"

    def __init__(self):
        self._t = _torch()

    def supports(self, dtype, layout) -> bool:
        return self._t is not None and self._t.backends.mkl.is_available()

    def gemm(self, out, a, b, accumulate=False, bias=None):
        t = self._t.from_numpy
        if accumulate:
            self._t.addmm(t(out), t(a), t(b), out=t(out))
        elif bias is not None:
            self._t.addmm(t(bias), t(a), t(b), out=t(out))
        else:
            self._t.mm(t(a), t(b), out=t(out))


class PerPassWeights:
    """A library that prepares each weight once per pass (oneDNN's packing, dnnl-t's row-major
    copy), keyed by the weight's memory: parameters change between passes (the optimizer updates
    them in place), so new_pass() drops what was prepared. `_prepare(b)` makes one."""

    def _init_cache(self):
        self._copies: dict = {}
        self._lock = threading.Lock()

    def new_pass(self):
        self._copies.clear()

    def _weight(self, b):
        key = (b.ctypes.data, b.shape, b.strides)
        w = self._copies.get(key)
        if w is None:
            w = self._prepare(b)
            with self._lock:
                self._copies[key] = w
        return w


class OneDnn(PerPassWeights):
    """oneDNN's inner product (PyTorch's copy, torch.ops.mkldnn._linear_pointwise) with the weight
    packed in oneDNN's blocked layout once per pass: x W packs W^T, dy W^T packs W. Parameters
    change between passes (the optimizer updates them in place), so new_pass() drops the packs."""
    name = "onednn"
    PACK_ROWS = 64             # the row count the blocked layout is tuned for (rates within 5% from 8 to 1024)

    def __init__(self):
        self._t = _torch()
        self._init_cache()

    def supports(self, dtype, layout) -> bool:
        if self._t is None or np.dtype(dtype).name != "float32" or layout not in ("nn", "nt"):
            return False
        try:
            return bool(self._t.backends.mkldnn.is_available() and self._t.ops.mkldnn._linear_pointwise)
        except (AttributeError, RuntimeError):
            return False

    def _prepare(self, b):
        # linear's weight is (outer, inner): W^T for x W (b = W), W itself for dy W^T (b = W.T)
        return self._t.ops.mkldnn._reorder_linear_weight(self._t.from_numpy(b).T, self.PACK_ROWS)

    def gemm(self, out, a, b, accumulate=False, bias=None):
        t, ops = self._t.from_numpy, self._t.ops.mkldnn
        w = self._weight(b)
        if accumulate:
            y = ops._linear_pointwise.binary(t(a), t(out), w, None, "add")
        else:
            y = ops._linear_pointwise(t(a), w, None if bias is None else t(bias), "none", [], "")
        t(out).copy_(y)


@functools.lru_cache(maxsize=None)
def _dnnl():
    """(dnnl_sgemm, version string) of oneDNN's own library (Intel's onednn-cpu-gomp wheel), or None.
    PyTorch is imported first where it is installed, so that the library finds PyTorch's GNU OpenMP
    already loaded and shares it: its threads then follow torch.set_num_threads (the "torch" pool)."""
    try:
        from importlib import metadata
        dist = metadata.distribution(DNNL_DISTRIBUTION)
        path = next(dist.locate_file(f) for f in dist.files or () if f.name == "libdnnl.so.3")
        _torch()
        lib = ctypes.CDLL(str(path))
    except (metadata.PackageNotFoundError, StopIteration, OSError):
        return None
    fn = lib.dnnl_sgemm
    index, real = ctypes.c_int64, ctypes.c_float
    fn.argtypes = [ctypes.c_char, ctypes.c_char, index, index, index, real, ctypes.c_void_p, index,
                   ctypes.c_void_p, index, real, ctypes.c_void_p, index]
    fn.restype = ctypes.c_int

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                    ("hash", ctypes.c_char_p)]
    lib.dnnl_version.restype = ctypes.POINTER(Version)
    v = lib.dnnl_version().contents
    return fn, f"{v.major}.{v.minor}.{v.patch}"


class Dnnl(StridedGemm):
    """oneDNN's own library and its BLAS-like dnnl_sgemm (float32 only), called as OpenBLAS's CBLAS
    is. Its just-in-time AVX-512 kernels are the ones TensorFlow's matmul runs; on the Zen 4 EPYC
    they beat OpenBLAS by 5-20% on the engine's shapes and by up to 1.7x on products of 8-16 rows."""
    name = "dnnl"
    _FLAG = {_CBLAS_NO_TRANS: b"N", _CBLAS_TRANS: b"T"}

    def __init__(self):
        super().__init__()
        found = _dnnl()
        self._sgemm = found[0] if found else None

    def supports(self, dtype, layout) -> bool:
        return self._sgemm is not None and np.dtype(dtype).name == "float32"

    def _fn(self, dtype):
        return self._sgemm if dtype == np.float32 else None

    @classmethod
    def _call(cls, fn, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
        status = fn(cls._FLAG[ta], cls._FLAG[tb], m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc)
        if status != 0:
            raise RuntimeError(f"dnnl_sgemm failed with status {status} on a {m}x{k} by {k}x{n} product")


class DnnlTransposed(PerPassWeights, Dnnl):
    """dy W^T as dy (W^T) with W^T copied out row-major once per pass, then dnnl_sgemm without a
    transpose. Measured on the Zen 4 EPYC, one thread: dnnl_sgemm on dy (rows x 1280) and a
    transposed 512 x 1280 weight runs at 70-109 GFLOP/s (16 to 1024 rows), on the row-major copy at
    109-115. The copy is the weight's packing (its time is measured and shared among the pass's
    products like oneDNN's): parameters change between passes, so new_pass() drops the copies."""
    name = "dnnl-t"

    def __init__(self):
        super().__init__()
        self._init_cache()

    def supports(self, dtype, layout) -> bool:
        return layout == "nt" and super().supports(dtype, layout)

    def _prepare(self, b):
        return row_major_copy(b)

    def gemm(self, out, a, b, accumulate=False, bias=None):
        super().gemm(out, a, self._weight(b) if layout_of(a, b) == "nt" else b, accumulate, bias)


def _numpy_copy(out, b):
    np.copyto(out, b)


def _torch_copy(out, b):
    _torch().from_numpy(out).copy_(_torch().from_numpy(b))


_COPIERS = {"numpy": _numpy_copy, "torch": _torch_copy}
_copier_of: dict = {}           # (shape, strides, dtype) -> the faster copy, measured on first use


def row_major_copy(b) -> np.ndarray:
    """A row-major copy of the strided `b` (a weight's transpose), by whichever of NumPy's and
    PyTorch's copies is faster on its layout, timed the first time the layout is seen. Neither wins
    everywhere (one thread on the Zen 4 EPYC, ms): 512 x 2560 NumPy 2.9, PyTorch 0.72; 1024 x 2560
    6.4 and 2.5; 256 x 10000 1.8 and 2.9 (NumPy slows down badly on power-of-two strides)."""
    out = weight_array(b.shape, b.dtype)
    key = (b.shape, b.strides, b.dtype.str)
    copy = _copier_of.get(key)
    if copy is None:
        names = [n for n in _COPIERS if n != "torch" or _torch() is not None]
        best = {}
        for _ in range(2):
            for name in names:
                t0 = time.perf_counter()
                _COPIERS[name](out, b)
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
        copy = _copier_of[key] = _COPIERS[min(best, key=best.get)]
    copy(out, b)
    return out


def dnnl_version() -> str | None:
    found = _dnnl()
    return found[1] if found else None


def make(name: str):
    return {"numpy": NumpyMatmul, "openblas": OpenBlas, "mkl": Mkl, "onednn": OneDnn, "dnnl": Dnnl,
            "dnnl-t": DnnlTransposed}[name]()


# ---------------------------------------------------------------- choosing

class Gemm:
    """out = a @ b (+ bias), or out += a @ b, by the library chosen for the product's key; with
    several threads, all of them from one thread pool (`pool`).

    A library that packs its weight (oneDNN) pays the packing once per pass for all products of
    that weight, whatever their row counts, so whether it pays off depends on how many products a
    pass makes with that weight at which row counts. Given the measured `times` ({key: {library:
    seconds}}) and `packs` ({key: {library: packing seconds}}), the choice is made anew at each
    new_pass() from the products the previous pass made (counted per key): per weight, the
    cheaper of the best library per key without packing, and the best per key with the packing
    paid once. Until a pass has been counted, `choice` holds the static one (blas.choose).

    With several threads, `pools` holds each pool's (static choice, times, packs), and the pool
    too is chosen anew at each new_pass(): the one with the least time for the products the passes
    so far made per pass on average. choose() can only sum the model's keys unweighted, and a pass
    makes some keys ten times as often as others: on Tree-LSTM h = 512 at two threads that sum
    chose OpenBLAS's pool, and the passes ran 15-20% slower than in PyTorch's."""

    def __init__(self, libraries: dict, choice: dict, default: str, forced: str | None = None,
                 pool: str | None = None, threads: int = 1, times: dict | None = None, packs: dict | None = None,
                 pools: dict | None = None):
        self.libraries, self.choice, self.default, self.forced = libraries, choice, default, forced
        self.pool, self.threads = pool, threads
        self.static_choice = dict(choice)
        self._times, self._packs = times or {}, packs or {}
        self._counts: dict = {}
        self._pools = pools or {}
        self._pool_counts: dict = {}       # products per key over the counted passes (for the pool)
        self._passes = 0
        self._pool_fastest: dict = {}      # per_pass_plan's memo, per pool's times
        self._fastest = self._pool_fastest.setdefault(pool, {})     # the memo for `_times`

    @property
    def name(self) -> str:
        """'onednn' (forced), or 'auto: onednn 14, openblas 4' (how many keys each library won, as
        chosen before the first pass)."""
        if self.forced:
            return self.forced
        won = {}
        for lib in self.static_choice.values():
            won[lib] = won.get(lib, 0) + 1
        pool = f" ({self.pool} pool, {self.threads} threads)" if self.threads > 1 else ""
        return ("auto: " + ", ".join(f"{k} {v}" for k, v in sorted(won.items(), key=lambda kv: -kv[1])) \
                if won else f"auto: {self.default}") + pool

    def new_pass(self):
        for lib in self.libraries.values():
            if hasattr(lib, "new_pass"):
                lib.new_pass()
        if self._counts and len(self._pools) > 1:
            self._choose_pool()
        if self._counts and self._times:
            self.choice.update(per_pass_choice(self._counts, self._times, self._packs, self._fastest))
        self._counts = {}

    def _choose_pool(self):
        self._passes += 1
        for k, n in self._counts.items():
            self._pool_counts[k] = self._pool_counts.get(k, 0) + n
        per_pass = {k: n / self._passes for k, n in self._pool_counts.items()}
        cost = {p: per_pass_plan(per_pass, times, packs, self._pool_fastest.setdefault(p, {}))[1]
                for p, (_, times, packs) in self._pools.items()}
        pool = min(cost, key=cost.get)
        if pool != self.pool:
            set_pool_threads(pool, self.threads)
            self.pool = pool
            static, self._times, self._packs = self._pools[pool]
            self._fastest = self._pool_fastest.setdefault(pool, {})
            self.choice, self.static_choice = dict(static), dict(static)

    def __call__(self, out, a, b, accumulate: bool = False, bias=None):
        layout = layout_of(a, b)
        if self.forced:
            lib = self.libraries[self.forced]
            if layout is None or not lib.supports(out.dtype, layout):
                lib = self.libraries[self.default]          # e.g. oneDNN has no x^T dy
            return lib.gemm(out, a, b, accumulate, bias)
        if layout is None:
            return self.libraries[self.default].gemm(out, a, b, accumulate, bias)
        key = key_of(layout, a, b)
        self._counts[key] = self._counts.get(key, 0) + 1
        self.libraries[self.choice.get(key, self.default)].gemm(out, a, b, accumulate, bias)


def per_pass_choice(counts: dict, times: dict, packs: dict, memo: dict | None = None) -> dict:
    """{key: library} for a pass that makes counts[key] products of each key: per weight (layout,
    inner, outer), the least total time, a packing library's packing paid once if any of the
    weight's keys use it."""
    return per_pass_plan(counts, times, packs, memo)[0]


def per_pass_plan(counts: dict, times: dict, packs: dict, memo: dict | None = None) -> tuple[dict, float]:
    """per_pass_choice's {key: library} and the pass's seconds with it (keys without times: none).
    `memo` keeps each key's fastest library under each packing rule across calls with the same
    `times` (the engine plans every pass: without it, a tenth of a Tree-LSTM batch's setup)."""
    memo = {} if memo is None else memo
    by_weight: dict = {}
    for k, n in counts.items():
        if k in times:
            by_weight.setdefault((k[0], k[2], k[3]), []).append((k, n))
    choice, total = {}, 0.0
    for keys in by_weight.values():
        packing = frozenset(lib for k, _ in keys for lib in packs.get(k, {}))
        best_plan, best_cost = None, float("inf")
        for allowed in [None] + sorted(packing):          # None: no packing library
            plan, cost, packed = {}, 0.0, False
            for k, n in keys:
                fastest = memo.get((k, packing, allowed))
                if fastest is None:
                    ts = {lib: t for lib, t in times[k].items() if lib not in packing or lib == allowed}
                    fastest = memo[(k, packing, allowed)] = min(ts.items(), key=lambda lt: lt[1]) if ts else ()
                if not fastest:
                    break
                lib, t = fastest
                plan[k], cost = lib, cost + n * t
                packed |= lib == allowed
            else:
                if packed:
                    cost += min(packs[k][allowed] for k, _ in keys if allowed in packs.get(k, {}))
                if cost < best_cost:
                    best_plan, best_cost = plan, cost
        choice.update(best_plan or {})
        total += best_cost if best_plan is not None else 0.0
    return choice, total


# libraries that share one thread pool: with several threads, the engine multiplies in one pool
# only, the other pinned to one thread (two pools of spinning workers on the same cores slowed a
# Tree-LSTM epoch at two threads 2-5x)
POOLS = {"openblas": ("openblas",), "torch": ("mkl", "onednn", "dnnl", "dnnl-t")}


def pool_of(library: str) -> str:
    return next((p for p, libs in POOLS.items() if library in libs), "openblas")


def set_pool_threads(pool: str | None, threads: int) -> None:
    """`threads` for the libraries of `pool`, one for the others (`pool` None: `threads` for all)."""
    from threadpoolctl import threadpool_limits
    blas_threads = threads if pool in (None, "openblas") else 1
    torch_threads = threads if pool in (None, "torch") else 1
    threadpool_limits(blas_threads, user_api="blas")
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(torch_threads)
    threadpool_limits(torch_threads, user_api="openmp")     # oneDNN's library shares PyTorch's OpenMP


def current_threads() -> int:
    """The most threads any of this process's GEMM pools uses now."""
    from threadpoolctl import threadpool_info
    counts = [i.get("num_threads") or 1 for i in threadpool_info() if i.get("user_api") == "blas"]
    torch = _torch()
    if torch is not None:
        counts.append(torch.get_num_threads())
    return max(counts or [1])


def available(dtype, layout: str | None = None) -> list[str]:
    """The libraries usable here for `dtype` (for `layout`, or for any), in LIBRARIES order."""
    out = []
    for name in LIBRARIES:
        lib = make(name)
        if any(lib.supports(dtype, lay) for lay in ([layout] if layout else ["nn", "nt", "tn"])) \
                and (name != "openblas" or _openblas_gemm()):
            out.append(name)
    return out


def _time_packing(lib, b) -> float:
    best = float("inf")
    for _ in range(3):
        lib.new_pass()
        t0 = time.perf_counter()
        lib._weight(b)
        best = min(best, time.perf_counter() - t0)
    return best


def _time_interleaved(libs: dict, out, a, b, accumulate) -> dict[str, float]:
    """{library: seconds} of each library's fastest call, timed in turn over ROUNDS rounds (each
    library once per round, repeated to MIN_TIMED_S): this VM's rate drifts by 5-10% within a
    second, so timing one library's calls after another's would rank them by when they ran.

    A long product (every library's call at least LONG_CALL_S) is timed in two samples instead:
    the call that sized the repeats, and one interleaved round. Those products took most of a
    model's first construction (the Var-LSTM at h = 1024 on the Zen 3 EPYC: 151 s, 94 s so), and
    two samples chose another library than four rounds only where the two were a few percent apart,
    as four rounds run twice did (docs/design.md)."""
    reps, sizing = {}, {}
    for name, lib in libs.items():
        lib.gemm(out, a, b, accumulate)            # first touch of the output, per-pass packing
        t0 = time.perf_counter()
        lib.gemm(out, a, b, accumulate)
        sizing[name] = time.perf_counter() - t0
        reps[name] = max(1, int(MIN_TIMED_S / max(sizing[name], 1e-9)))
    long = min(sizing.values(), default=0.0) >= LONG_CALL_S
    best = dict(sizing) if long else dict.fromkeys(libs, float("inf"))
    for _ in range(1 if long else ROUNDS):
        for name, lib in libs.items():
            t0 = time.perf_counter()
            for _ in range(reps[name]):
                lib.gemm(out, a, b, accumulate)
            best[name] = min(best[name], (time.perf_counter() - t0) / reps[name])
    return best


def measure(keys, dtype, libraries: list[str], packing: bool = False, threads: int = 1) -> dict[tuple, dict[str, float]]:
    """{key: {library: seconds}} for each product key (layout, rows, inner, outer), on operands laid
    out as the engine's are (a parameter-gradient key accumulates, the others write). With
    `packing`, a library that packs its weight (oneDNN) also reports the packing's seconds, as
    "pack:<library>" (the engine packs a weight once per pass: choose() shares it among the pass's
    products). With several `threads`, the libraries are timed under each pool's setting
    (set_pool_threads): the pool's own at `threads` ("openblas@2"), the others at one ("mkl@1"),
    each (library, threads) once."""
    out: dict = {}
    if threads > 1:
        for pool in POOLS:
            set_pool_threads(pool, threads)
            for key, times in measure(keys, dtype, libraries, packing).items():
                mine = out.setdefault(key, {})
                for name, t in times.items():
                    lib = name.removeprefix("pack:")
                    tag = f"{lib}@{threads if lib in POOLS[pool] else 1}"
                    mine.setdefault(("pack:" if name.startswith("pack:") else "") + tag, t)
        return out
    rng = np.random.default_rng(0)
    libs = {name: make(name) for name in libraries}
    for layout, rows, inner, outer in keys:
        if layout == "tn":            # dW (inner x outer) += x^T dy over `rows` rows
            x = rng.uniform(-1, 1, (rows, inner)).astype(dtype)
            a, b = x.T, rng.uniform(-1, 1, (rows, outer)).astype(dtype)
            c = np.zeros((inner, outer), dtype)
        else:                         # x W, or dx = dy W^T: W laid out as the engine's parameters are
            shape = (outer, inner) if layout == "nt" else (inner, outer)
            w = weight_array(shape, dtype)
            w[...] = rng.uniform(-1, 1, shape)
            a, b = rng.uniform(-1, 1, (rows, inner)).astype(dtype), (w.T if layout == "nt" else w)
            c = np.empty((rows, outer), dtype)
        usable = {name: lib for name, lib in libs.items() if lib.supports(dtype, layout)}
        for lib in usable.values():
            if hasattr(lib, "new_pass"):
                lib.new_pass()
        times = _time_interleaved(usable, c, a, b, layout == "tn")
        if packing:
            times.update({f"pack:{name}": _time_packing(lib, b) for name, lib in usable.items() if hasattr(lib, "new_pass")})
        out[(layout, rows, inner, outer)] = times
    return out


def cache_key(dtype, threads: int | None) -> str:
    """What a measured choice depends on: the CPU, the libraries (and OpenBLAS's kernel set), the
    threads, the dtype."""
    from .backend.cpu import cpu_generation, cpu_model
    facts = {"cpu": cpu_model(), **cpu_generation(), "python": sys.version.split()[0], "numpy": np.__version__,
             "torch": getattr(_torch(), "__version__", None), "dnnl": dnnl_version(), "openblas_kernels": openblas_kernels(),
             "threads": threads, "dtype": np.dtype(dtype).name, "format": "times per library, interleaved, the mean of timed_rows; dnnl-t copies by the faster of numpy and torch",
             "weight_offset": WEIGHT_OFFSET}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:20]


def openblas_kernels() -> str | None:
    """The kernel set NumPy's OpenBLAS runs ('Haswell', 'SkylakeX', ...), from threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    return next((i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"
                 and "numpy" in i.get("filepath", "")), None)


def cache_path(dtype, threads: int | None) -> Path | None:
    from .fusion import kernel_cache_dir
    where = kernel_cache_dir()
    return None if where is None else where / f"blas-{cache_key(dtype, threads)}.json"


def read_cache(path: Path | None) -> dict:
    if path is None or not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return {tuple(json.loads(k)): v for k, v in data["times"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"{path}: the cached GEMM choices cannot be read ({type(exc).__name__}: {exc}); "
                      "measuring them again", RuntimeWarning, stacklevel=3)
        return {}


def write_cache(path: Path | None, choices: dict) -> None:
    """{key: {library: seconds}} into `path`, written whole and renamed over."""
    if path is None:
        return
    data = {"times": {json.dumps(list(k)): v for k, v in sorted(choices.items())}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def choose(keys, dtype, threads: int | None = None, blas: str | None = None, uses: dict | None = None) -> Gemm:
    """The engine's Gemm: `blas` "auto" (default: $CAVS_CPU_BLAS, else auto) chooses per key by
    measurement (the libraries' times are cached); a library's name forces it for every product it
    can run. `uses` {(layout, inner, outer): products per pass} shares a library's packing among
    a pass's products of that shape (default LOOP_USES). With several threads, all products run in
    one thread pool (POOLS): the one whose libraries are fastest over the model's keys together."""
    blas = blas or os.environ.get("CAVS_CPU_BLAS") or "auto"
    if blas not in CHOICES:
        raise ValueError(f"unknown blas {blas!r}; choose one of {', '.join(CHOICES)}")
    dtype = np.dtype(dtype)
    names = available(dtype)
    threads = threads or current_threads()
    default = "openblas" if "openblas" in names else "numpy"
    if blas != "auto":
        if blas != "numpy" and blas not in names:
            raise ValueError(f"blas {blas!r} is not usable here for {dtype.name} (usable: {', '.join(names)})")
        pool = pool_of(blas) if threads > 1 and blas != "numpy" else None
        fallback = default if pool in (None, "openblas") else "mkl"
        return Gemm({blas: make(blas), fallback: make(fallback)}, {}, fallback, forced=blas, pool=pool,
                    threads=threads)
    libraries = {name: make(name) for name in names + ["numpy"]}
    path = cache_path(dtype, threads)
    cached = read_cache(path)
    keys = sorted(set(keys))
    runs = {layout: {f"{lib}@{t}" for lib in names if libraries[lib].supports(dtype, layout)
                     for t in ({1, threads} if threads > 1 else {1})} for layout in ("nn", "nt", "tn")}
    missing = [k for k in keys if not isinstance(cached.get(k), dict) or not runs[k[0]] <= set(cached[k])]
    if missing:
        at = {(layout, r, inner, outer): (layout, rows, inner, outer)
              for layout, rows, inner, outer in missing for r in timed_rows(rows)}
        measured = {}
        for k, ts in measure(list(at), dtype, names, packing=True, threads=threads).items():
            mean = measured.setdefault(at[k], {})
            share = 1 / len(timed_rows(at[k][1]))
            for name, t in ts.items():
                mean[name] = mean.get(name, 0.0) + t * share
        if threads == 1:         # one setting: tag every library with its single thread
            measured = {k: {(("pack:" + n[5:]) if n.startswith("pack:") else n) + "@1": t for n, t in ts.items()}
                        for k, ts in measured.items()}
        cached.update(measured)
        write_cache(path, cached)
    uses = uses or {}

    def effective(k, tag):      # a product's seconds, with its share of its weight's packing
        per_pass = uses.get((k[0], k[2], k[3]), LOOP_USES)
        return cached[k][tag] + cached[k].get(f"pack:{tag}", 0.0) / per_pass

    def tags(pool):             # (library, its threads) under a pool's setting
        return {f"{lib}@{threads if pool is None or lib in POOLS[pool] else 1}": lib for lib in names}
    def plan(pool):             # a pool's (static choice, times, packs) per key
        candidates = tags(pool)
        choice, times, packs = {}, {}, {}
        for k in keys:
            ts = {t: effective(k, t) for t in candidates if t in cached[k]}
            choice[k] = candidates[min(ts, key=ts.get)] if ts else default
            times[k] = {candidates[t]: cached[k][t] for t in candidates if t in cached[k]}
            packs[k] = {candidates[t]: cached[k][f"pack:{t}"] for t in candidates if f"pack:{t}" in cached[k]}
        return choice, times, packs
    if threads == 1:
        choice, times, packs = plan(None)
        return Gemm(libraries, choice, default, times=times, packs=packs)
    # several threads: to start with, the pool whose setting gives the model's keys the least time
    # together; from the first counted pass on, Gemm weighs them by the products passes make
    def total(p):
        return sum(min((effective(k, t) for t in tags(p) if t in cached[k]), default=float("inf")) for k in keys)
    pool = min(POOLS, key=total)
    pools = {p: plan(p) for p in POOLS}
    choice, times, packs = pools[pool]
    return Gemm(libraries, dict(choice), default, pool=pool, threads=threads, times=times, packs=packs,
                pools=pools)
