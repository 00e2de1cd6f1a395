"""A stand-in for CuPy over NumPy, so that the CuPy backend's code paths run on machines without a
GPU (tests/engine/test_gpu_standin.py).

It provides the documented CuPy API that cavs/backend/cupy.py, fusion.py's cupy kernels, loss.py's
`_blocked` and the engine use, with CuPy's signatures and CuPy's refusals, and nothing else (a
misspelt or undocumented call is an AttributeError or a TypeError here as it is in CuPy):

- `ndarray`: a wrapper of a NumPy array (views stay views), not a NumPy array: implicit conversion
  (`np.asarray(x)`) raises TypeError as CuPy does; mixing a NumPy array into a ufunc or an
  operator raises TypeError ("Unsupported type"); assigning a non-scalar NumPy array through basic
  indexing raises ValueError (CuPy's `fill` path); NumPy functions and ufuncs called on it dispatch
  to this module (CuPy's __array_function__ / __array_ufunc__), or fail where it has no such function.
- creation (`array`, `asarray`, `empty`, `zeros`, `*_like`, `arange`...), `asnumpy`, ufuncs,
  `take(a, indices, axis=None, out=None)` (CuPy's out checks), `unique`, `matmul(x1, x2, out=)`,
  `vdot`, reductions, `cupyx.scatter_add(a, slices, value)` / `scatter_max` / `scatter_min` (CuPy's
  dtype checks), `get_default_memory_pool()`.
- `cuda.Stream(null=False, non_blocking=False, ptds=False)` with `record()` -> `Event`,
  `wait_event(event)`, `synchronize()`, `with stream:`; `get_current_stream()`;
  `runtime.getDeviceCount()`. Work runs at once, but every launch records which stream it ran on
  and which memory it read and wrote: a launch that touches memory another stream wrote (or read,
  for a write) without an event ordering the two, or a host read (`asnumpy`, `float()`) of memory
  a stream wrote that the current stream has not waited for, raises StreamHazard. A non-blocking
  stream is ordered with the null stream only by events; a blocking one as CUDA's legacy stream.
- `ElementwiseKernel(in_params, out_params, operation, name, reduce_dims=True, preamble='', ...)`:
  at its first call per dtype the kernel's source is checked with a C++ compiler (`-fsyntax-only`)
  as CuPy would compile it: `typedef float T;` (or double) for each type placeholder, the preamble
  (`__device__` defined away), the CUDA C math API's float and double functions declared (expf,
  tanhf, fmaxf, ..., exp, tanh, fmax, ...; no C++ overloads, whose set in NVRTC's headers varies),
  and the operation inside the loop with `const T &in0 = ...; T &out0 = ...;`; with
  -Werror=double-promotion and -Werror=float-conversion, so a float kernel that computes in
  double (a bare 0.5) fails too. Then the operation is evaluated with NumPy: statements
  `[T] name = expression;` over + - * /, comparisons, T(...) casts, numeric literals, the CUDA math
  functions and the preamble's one-line `return` functions (overloads chosen by dtype). Anything
  else raises NotImplementedError (the stand-in cannot run it; the check says so, it does not pass).

`install(monkeypatch, compiler)` puts it in sys.modules as cupy, cupyx and their submodules.
"""
from __future__ import annotations

import ast
import hashlib
import re
import subprocess
import sys
import types
from collections import Counter

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:             # NumPy 1.x
    _byte_bounds = np.byte_bounds

_SCALAR_TYPES = (bool, int, float, complex, np.generic)


class StreamHazard(AssertionError):
    """Two streams (or the host) touch the same memory without an event ordering them."""


class CompileError(RuntimeError):
    """What the C++ compiler said about a kernel's source (CuPy raises cupy.cuda.compiler.CompileException)."""


CALLS: Counter = Counter()       # which stand-in API was used, for tests to check coverage


# ---------------------------------------------------------------- streams and their ordering

class _Tracker:
    def __init__(self):
        self.reset()

    def reset(self):
        self.streams = []
        self.records = {}          # stream -> [(seq, numpy view, is_write)] in launch order, not known complete
        self.current = []          # the `with stream:` stack

    def current_stream(self):
        return self.current[-1] if self.current else Stream.null

    def _legacy(self, s):
        """CUDA's legacy null stream waits for the blocking streams' work, and they for its."""
        if s.is_null:
            for other in self.streams:
                if other is not s and other.blocking_legacy:
                    s.visible[other] = other.seq
        elif s.blocking_legacy:
            s.visible[Stream.null] = Stream.null.seq

    def _unordered(self, s, view, is_write, host=False):
        """The first access by another stream to `view`'s memory that `s` is not ordered after."""
        for other, recs in self.records.items():
            if other is s:
                continue
            seen = s.visible.get(other, 0)
            for seq, old, old_write in reversed(recs):
                if seq <= seen:
                    break
                if (old_write or (is_write and not host)) and _overlap(view, old):
                    return other, seq, old_write
        return None

    def launch(self, reads=(), writes=()):
        """A kernel on the current stream reading `reads` and writing `writes` (stand-in arrays)."""
        s = self.current_stream()
        self._legacy(s)
        s.seq += 1
        views = [(a._a, False) for a in reads if isinstance(a, ndarray) and a.size] + \
                [(a._a, True) for a in writes if isinstance(a, ndarray) and a.size]
        for view, is_write in views:
            found = self._unordered(s, view, is_write)
            if found:
                other, seq, old_write = found
                raise StreamHazard(f"{s!r} {'writes' if is_write else 'reads'} memory that {other!r} "
                                   f"{'wrote' if old_write else 'read'} in its launch {seq}, with no event ordering "
                                   f"the two ({s!r} has waited for launch {s.visible.get(other, 0)} of {other!r})")
        self.records.setdefault(s, []).extend((s.seq, view, is_write) for view, is_write in views)

    def host_read(self, a):
        """The host reads `a` after waiting for the current stream (cupy.asnumpy, float(x))."""
        s = self.current_stream()
        self._legacy(s)
        if a.size:
            found = self._unordered(s, a._a, False, host=True)
            if found:
                other, seq, _ = found
                raise StreamHazard(f"the host reads memory that {other!r} wrote in its launch {seq}, after waiting "
                                   f"only for {s!r}, which has not waited for that launch")
        self.synchronized(s)

    def synchronized(self, s):
        """The host waited for stream s: its work, and the work it waited for, is complete."""
        done = {s: s.seq, **s.visible}
        for stream, recs in self.records.items():
            upto = done.get(stream, 0)
            self.records[stream] = [r for r in recs if r[0] > upto]

    def device_synchronized(self):
        self.records = {}


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    lo_a, hi_a = _byte_bounds(a)
    lo_b, hi_b = _byte_bounds(b)
    if hi_a <= lo_b or hi_b <= lo_a:
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=10_000))
    except np.exceptions.TooHardError:
        return True


TRACKER = _Tracker()


class Event:
    """cupy.cuda.Event(block=False, disable_timing=False, interprocess=False)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.stream, self.seq = None, 0

    def record(self, stream=None):
        CALLS["Event.record"] += 1
        stream = stream or TRACKER.current_stream()
        self.stream, self.seq = stream, stream.seq

    def synchronize(self):
        CALLS["Event.synchronize"] += 1
        if self.stream is not None:
            recs = TRACKER.records.get(self.stream, [])
            TRACKER.records[self.stream] = [r for r in recs if r[0] > self.seq]

    @property
    def done(self):
        return True


class Stream:
    """cupy.cuda.Stream(null=False, non_blocking=False, ptds=False)."""
    null: "Stream"

    def __init__(self, null=False, non_blocking=False, ptds=False):
        CALLS["Stream"] += 1
        self.is_null = bool(null)
        self.blocking_legacy = bool(null) or not non_blocking
        self.seq = 0
        self.visible: dict = {}
        self.name = "the null stream" if null else f"stream {len(TRACKER.streams)}"
        TRACKER.streams.append(self)

    def __repr__(self):
        return self.name

    def record(self, event=None):
        """Records an event on this stream (a new one unless given) and returns it."""
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event):
        CALLS["Stream.wait_event"] += 1
        if not isinstance(event, Event):
            raise TypeError(f"wait_event expects a cupy.cuda.Event, got {type(event).__name__}")
        if event.stream is not None and event.stream is not self:
            self.visible[event.stream] = max(self.visible.get(event.stream, 0), event.seq)
            for other, seen in event.stream.visible.items():      # what that stream had waited for
                if other is not self:
                    self.visible[other] = max(self.visible.get(other, 0), seen)

    def synchronize(self):
        CALLS["Stream.synchronize"] += 1
        TRACKER.synchronized(self)

    def use(self):
        TRACKER.current[:] = [self]
        return self

    @property
    def done(self):
        return True

    @property
    def ptr(self):
        return 0 if self.is_null else id(self)

    def __enter__(self):
        CALLS["Stream.__enter__"] += 1
        TRACKER.current.append(self)
        return self

    def __exit__(self, *exc):
        TRACKER.current.pop()
        return False


def _new_null_stream():
    Stream.null = Stream(null=True)


_new_null_stream()


def get_current_stream(device_id=-1):
    CALLS["get_current_stream"] += 1
    return TRACKER.current_stream()


class Device:
    def __init__(self, device=None):
        self.id = 0 if device is None else int(device)

    def synchronize(self):
        TRACKER.device_synchronized()

    @property
    def compute_capability(self):
        return "90"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _runtime_module():
    m = types.ModuleType("cupy.cuda.runtime")
    m.getDeviceCount = lambda: 1
    m.deviceSynchronize = TRACKER.device_synchronized
    m.runtimeGetVersion = lambda: 13000
    m.driverGetVersion = lambda: 13000
    m.getDeviceProperties = lambda device: {"name": b"stand-in GPU (NumPy)", "totalGlobalMem": 0}
    return m


class _MemoryPool:
    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0

    def free_all_blocks(self, stream=None):
        pass


_POOL = _MemoryPool()


def get_default_memory_pool():
    return _POOL


# ---------------------------------------------------------------- arrays

def _np(a):
    return a._a if isinstance(a, ndarray) else a


def _wrap(a):
    if isinstance(a, np.ndarray):
        return ndarray(a)
    if isinstance(a, np.generic):       # CuPy returns 0-d arrays, never NumPy scalars
        return ndarray(np.asarray(a))
    return a


def _operand(x, what="argument"):
    """A ufunc or kernel argument as CuPy takes it: its array, or a Python / NumPy scalar."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, _SCALAR_TYPES):
        return x
    raise TypeError(f"Unsupported type {type(x)}")


def _index(key):
    """An index as CuPy takes it (NumPy arrays and lists are converted to device arrays)."""
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    if isinstance(key, ndarray):
        return key._a
    if isinstance(key, (list, np.ndarray)):
        arr = np.asarray(key)
        if arr.dtype.kind not in "iub":
            raise IndexError("arrays used as indices must be of integer or boolean type")
        return arr
    return key


def _is_scalar(v) -> bool:
    return isinstance(v, _SCALAR_TYPES) or (isinstance(v, np.ndarray) and v.ndim == 0)


def _view_of(a: np.ndarray, key) -> np.ndarray:
    """a[key] as a view, also where key names one element (a 0-d view, as CuPy's)."""
    keys = key if isinstance(key, tuple) else (key,)
    return a[keys if Ellipsis in keys else keys + (Ellipsis,)]


def _touched(a: "ndarray", key) -> "ndarray":
    """The part of `a` an indexed read or write touches, for the stream records: with an integer
    array on the first axis, the rows from its least to its largest index (a bound: a gather or
    scatter touches no row outside it); else all of `a`."""
    first = key[0] if isinstance(key, tuple) and key else key
    idx = first._a if isinstance(first, ndarray) else first
    if isinstance(idx, list):
        idx = np.asarray(idx)
    if not isinstance(idx, np.ndarray) or idx.dtype.kind not in "iu" or idx.size == 0 or a.ndim == 0:
        return a
    rows = np.where(idx < 0, idx + a.shape[0], idx)
    return ndarray(a._a[int(rows.min()):int(rows.max()) + 1])


def _advanced(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (ndarray, np.ndarray, list)) for k in keys)


class _Flags:
    def __init__(self, a):
        self.c_contiguous = a.flags.c_contiguous
        self.f_contiguous = a.flags.f_contiguous
        self.owndata = a.flags.owndata

    def __getitem__(self, name):
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous,
                "OWNDATA": self.owndata}[name]


class ndarray:
    """cupy.ndarray, on NumPy memory."""
    __slots__ = ("_a",)
    __hash__ = None

    def __init__(self, a):
        if not isinstance(a, np.ndarray):
            raise TypeError("the stand-in's ndarray wraps a NumPy array; create arrays with cupy.empty/array")
        self._a = a

    # -------- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: _Flags(self._a))
    T = property(lambda self: ndarray(self._a.T))

    @property
    def device(self):
        return Device(0)

    def __repr__(self):
        return "stand-in cupy " + repr(self._a)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        for k in range(len(self._a)):
            yield ndarray(self._a[k:k + 1].reshape(self._a.shape[1:]))

    # -------- to the host (each waits for the current stream)
    def get(self, stream=None, order="C", out=None, blocking=True):
        CALLS["ndarray.get"] += 1
        TRACKER.host_read(self)
        return np.array(self._a, order=order)

    def item(self):
        TRACKER.host_read(self)
        return self._a.item()

    def tolist(self):
        TRACKER.host_read(self)
        return self._a.tolist()

    def __float__(self):
        TRACKER.host_read(self)
        return float(self._a)

    def __int__(self):
        TRACKER.host_read(self)
        return int(self._a)

    def __bool__(self):
        TRACKER.host_read(self)
        return bool(self._a)

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct "
                        "a NumPy array explicitly.")

    # -------- NumPy's protocols: CuPy answers NumPy's functions and ufuncs called on its arrays
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        fn = _UFUNCS.get(ufunc.__name__)
        if method != "__call__" or fn is None:
            return NotImplemented
        return fn(*inputs, **kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        fn = _FUNCTIONS.get(func.__name__)
        if fn is None:
            return NotImplemented
        return fn(*args, **kwargs)

    # -------- indexing
    def __getitem__(self, key):
        k = _index(key)
        out = self._a[k]
        if _advanced(key):             # a gather kernel into a new array
            res = ndarray(np.asarray(out))
            TRACKER.launch(reads=[_touched(self, key)] + [x for x in (key if isinstance(key, tuple) else (key,))
                                           if isinstance(x, ndarray)], writes=[res])
            return res
        return _wrap(out) if isinstance(out, np.ndarray) else ndarray(np.asarray(out))

    def __setitem__(self, key, value):
        CALLS["ndarray.__setitem__"] += 1
        k = _index(key)
        if isinstance(value, ndarray):
            v = value._a
        elif _is_scalar(value):
            v = value
        elif _advanced(key):          # CuPy converts the value of a scatter to a device array
            v = np.asarray(value)
        else:                         # basic indexing: CuPy's y.fill(value), which takes scalars only
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        if _advanced(key):
            TRACKER.launch(reads=[x for x in [value] + list(key if isinstance(key, tuple) else (key,))
                                  if isinstance(x, ndarray)], writes=[_touched(self, key)])
        else:
            TRACKER.launch(reads=[value] if isinstance(value, ndarray) else [], writes=[ndarray(_view_of(self._a, k))])
        self._a[k] = v

    # -------- arithmetic: the ufuncs
    def __add__(self, o): return add(self, o)
    def __radd__(self, o): return add(o, self)
    def __iadd__(self, o): return add(self, o, out=self)
    def __sub__(self, o): return subtract(self, o)
    def __rsub__(self, o): return subtract(o, self)
    def __isub__(self, o): return subtract(self, o, out=self)
    def __mul__(self, o): return multiply(self, o)
    def __rmul__(self, o): return multiply(o, self)
    def __imul__(self, o): return multiply(self, o, out=self)
    def __truediv__(self, o): return true_divide(self, o)
    def __rtruediv__(self, o): return true_divide(o, self)
    def __itruediv__(self, o): return true_divide(self, o, out=self)
    def __pow__(self, o): return power(self, o)
    def __rpow__(self, o): return power(o, self)
    def __neg__(self): return negative(self)
    def __pos__(self): return self.copy()
    def __abs__(self): return absolute(self)
    def __invert__(self): return invert(self)
    def __and__(self, o): return bitwise_and(self, o)
    def __or__(self, o): return bitwise_or(self, o)
    def __lt__(self, o): return less(self, o)
    def __le__(self, o): return less_equal(self, o)
    def __gt__(self, o): return greater(self, o)
    def __ge__(self, o): return greater_equal(self, o)
    def __eq__(self, o): return equal(self, o)
    def __ne__(self, o): return not_equal(self, o)

    def __matmul__(self, o):
        return matmul(self, o)

    def __rmatmul__(self, o):
        return matmul(o, self)

    # -------- methods (cupy.ndarray's)
    def fill(self, value):
        if not _is_scalar(value):
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        TRACKER.launch(writes=[self])
        self._a.fill(value)

    def copy(self, order="C"):
        return _unary_launch(self, np.array(self._a, order=order, copy=True))

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        out = self._a.astype(dtype, order=order, copy=copy)
        return self if out is self._a else _unary_launch(self, out)

    def ravel(self, order="C"):
        out = self._a.ravel(order)
        return ndarray(out) if np.shares_memory(out, self._a) else _unary_launch(self, out)

    def reshape(self, *shape, order="C"):
        out = self._a.reshape(*shape, order=order)
        return ndarray(out) if np.shares_memory(out, self._a) else _unary_launch(self, out)

    def view(self, dtype=None):
        return ndarray(self._a.view() if dtype is None else self._a.view(dtype))

    def transpose(self, *axes):
        return ndarray(self._a.transpose(*axes))

    def squeeze(self, axis=None):
        return ndarray(self._a.squeeze(axis))

    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return _reduce(np.sum, self, axis, dtype=dtype, out=out, keepdims=keepdims)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        return _reduce(np.mean, self, axis, dtype=dtype, out=out, keepdims=keepdims)

    def max(self, axis=None, out=None, keepdims=False):
        return _reduce(np.max, self, axis, out=out, keepdims=keepdims)

    def min(self, axis=None, out=None, keepdims=False):
        return _reduce(np.min, self, axis, out=out, keepdims=keepdims)

    def all(self, axis=None, out=None, keepdims=False):
        return _reduce(np.all, self, axis, out=out, keepdims=keepdims)

    def any(self, axis=None, out=None, keepdims=False):
        return _reduce(np.any, self, axis, out=out, keepdims=keepdims)

    def take(self, indices, axis=None, out=None):
        return take(self, indices, axis=axis, out=out)

    def dot(self, b, out=None):
        return dot(self, b, out=out)

    def scatter_add(self, slices, value):
        _scatter(self, slices, value, "add")

    def scatter_max(self, slices, value):
        _scatter(self, slices, value, "max")

    def scatter_min(self, slices, value):
        _scatter(self, slices, value, "min")


def _unary_launch(src, result: np.ndarray):
    out = ndarray(result)
    TRACKER.launch(reads=[src], writes=[out])
    return out


def _check_out(out):
    if out is not None and not isinstance(out, ndarray):
        raise TypeError("Output arguments type must be cupy.ndarray")


def _reduce(fn, a, axis, out=None, **kw):
    _check_out(out)
    CALLS[f"reduce.{fn.__name__}"] += 1
    res = fn(_operand(a), axis=axis, out=None if out is None else out._a, **kw)
    result = out if out is not None else ndarray(np.asarray(res))
    TRACKER.launch(reads=[a], writes=[result])
    return result


# ---------------------------------------------------------------- ufuncs

class ufunc:
    """A CuPy ufunc: f(*inputs, out=None, dtype=None, casting='same_kind')."""

    def __init__(self, np_ufunc):
        self._f = np_ufunc
        self.__name__ = np_ufunc.__name__
        self.nin, self.nout = np_ufunc.nin, np_ufunc.nout
        self.nargs = self.nin + self.nout

    def __repr__(self):
        return f"<stand-in ufunc '{self.__name__}'>"

    def __call__(self, *args, out=None, dtype=None, casting="same_kind"):
        CALLS[f"ufunc.{self.__name__}"] += 1
        if not self.nin <= len(args) <= self.nargs:
            raise TypeError(f"Wrong number of arguments for '{self.__name__}'. It must be either {self.nin} or "
                            f"{self.nargs} (with outputs), but given {len(args)}.")
        ins, outs = args[:self.nin], args[self.nin:]
        if out is not None:
            if outs:
                raise ValueError("Cannot specify 'out' as both a positional and keyword argument")
            outs = out if isinstance(out, tuple) else (out,)
        for o in outs:
            _check_out(o)
        values = [_operand(x) for x in ins]
        kw = {"casting": casting}
        if dtype is not None:
            kw["dtype"] = dtype
        if outs:
            kw["out"] = tuple(o._a for o in outs)
        res = self._f(*values, **kw)
        if outs:
            result = outs[0] if len(outs) == 1 else tuple(outs)
            written = list(outs)
        else:
            result = _wrap(np.asarray(res)) if self.nout == 1 else tuple(_wrap(np.asarray(r)) for r in res)
            written = [result] if self.nout == 1 else list(result)
        TRACKER.launch(reads=[x for x in ins if isinstance(x, ndarray)], writes=written)
        return result


_UFUNC_NAMES = ("add", "subtract", "multiply", "divide", "true_divide", "negative", "power", "maximum", "minimum",
                "fmax", "fmin", "exp", "log", "tanh", "sqrt", "absolute", "sign", "isfinite", "isnan", "greater",
                "greater_equal", "less", "less_equal", "equal", "not_equal", "logical_not", "logical_and",
                "logical_or", "invert", "bitwise_and", "bitwise_or", "square", "expm1", "log1p", "sin", "cos")
_UFUNCS = {}
for _name in _UFUNC_NAMES:
    _UFUNCS[_name] = ufunc(getattr(np, _name))
    globals()[_name] = _UFUNCS[_name]
_UFUNCS["abs"] = absolute


# ---------------------------------------------------------------- functions (CuPy's signatures)

inf, nan, newaxis, pi, e = np.inf, np.nan, np.newaxis, np.pi, np.e
float16, float32, float64 = np.float16, np.float32, np.float64
int8, int16, int32, int64, uint8, uint32, uint64 = np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64
bool_, intp, dtype = np.bool_, np.intp, np.dtype
isscalar = np.isscalar


def _from_host(obj, dtype=None, copy=True, order="K"):
    if isinstance(obj, ndarray):
        return np.array(obj._a, dtype=dtype, copy=copy, order=order)
    return np.array(obj, dtype=dtype, copy=True, order=order)


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    CALLS["array"] += 1
    a = _from_host(obj, dtype, True, order)
    if ndmin:
        a = np.array(a, ndmin=ndmin, copy=False)
    out = ndarray(a)
    TRACKER.launch(reads=[obj] if isinstance(obj, ndarray) else [], writes=[out])
    return out


def asarray(a, dtype=None, order=None, *, blocking=False):
    CALLS["asarray"] += 1
    if isinstance(a, ndarray) and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return array(a, dtype=dtype, order=order or "K")


def ascontiguousarray(a, dtype=None):
    if isinstance(a, ndarray) and a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return array(a, dtype=dtype, order="C")


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    CALLS["asnumpy"] += 1
    if isinstance(a, ndarray):
        TRACKER.host_read(a)
        if out is not None:
            out[...] = a._a
            return out
        return np.array(a._a, order=order)
    return np.asarray(a, order=order)


def _created(a):
    out = ndarray(a)
    TRACKER.launch(writes=[out])
    return out


def empty(shape, dtype=float, order="C"):
    return ndarray(np.empty(shape, dtype=dtype, order=order))


def zeros(shape, dtype=float, order="C"):
    return _created(np.zeros(shape, dtype=dtype, order=order))


def ones(shape, dtype=float, order="C"):
    return _created(np.ones(shape, dtype=dtype, order=order))


def full(shape, fill_value, dtype=None, order="C"):
    return _created(np.full(shape, fill_value, dtype=dtype, order=order))


def _like_shape(a, shape):
    return a.shape if shape is None else shape


def empty_like(prototype, dtype=None, order="K", subok=None, shape=None):
    return ndarray(np.empty(_like_shape(prototype, shape), dtype=dtype or prototype.dtype))


def zeros_like(a, dtype=None, order="K", subok=None, shape=None):
    return _created(np.zeros(_like_shape(a, shape), dtype=dtype or a.dtype))


def ones_like(a, dtype=None, order="K", subok=None, shape=None):
    return _created(np.ones(_like_shape(a, shape), dtype=dtype or a.dtype))


def full_like(a, fill_value, dtype=None, order="K", subok=None, shape=None):
    return _created(np.full(_like_shape(a, shape), fill_value, dtype=dtype or a.dtype))


def arange(start, stop=None, step=1, dtype=None):
    return _created(np.arange(start, stop, step, dtype=dtype) if stop is not None
                    else np.arange(start, dtype=dtype))


def take(a, indices, axis=None, out=None):
    """cupy.take: `out` must have the result's dtype (TypeError) and shape (ValueError)."""
    CALLS["take"] += 1
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    _check_out(out)
    idx = _index(indices)
    ishape = np.shape(idx)
    if axis is None:
        shape = ishape
    else:
        ax = axis % a.ndim
        shape = a.shape[:ax] + ishape + a.shape[ax + 1:]
    if out is not None:
        if out.dtype != a.dtype:
            raise TypeError("Output dtype mismatch")
        if out.shape != shape:
            raise ValueError("Output shape mismatch")
        np.take(a._a, idx, axis=axis, out=out._a)
        result = out
    else:
        result = ndarray(np.take(a._a, idx, axis=axis))
    TRACKER.launch(reads=[_touched(a, indices) if axis == 0 else a, indices], writes=[result])
    return result


def unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None, *, equal_nan=True):
    CALLS["unique"] += 1
    res = np.unique(_operand(ar), return_index=return_index, return_inverse=return_inverse,
                    return_counts=return_counts, axis=axis)
    out = tuple(ndarray(r) for r in res) if isinstance(res, tuple) else ndarray(res)
    TRACKER.launch(reads=[ar], writes=list(out) if isinstance(out, tuple) else [out])
    return out


def matmul(x1, x2, /, out=None, **kwargs):
    """cupy.matmul (a generalized ufunc): out=, dtype=, casting= ..."""
    CALLS["matmul"] += 1
    unknown = set(kwargs) - {"dtype", "casting", "order", "axes", "axis"}
    if unknown:
        raise TypeError(f"Wrong arguments {sorted(unknown)}")
    if not isinstance(x1, ndarray) or not isinstance(x2, ndarray):
        raise TypeError(f"Unsupported type {type(x1 if not isinstance(x1, ndarray) else x2)}")
    _check_out(out)
    if out is not None:
        np.matmul(x1._a, x2._a, out=out._a, **kwargs)
        result = out
    else:
        result = ndarray(np.matmul(x1._a, x2._a, **kwargs))
    TRACKER.launch(reads=[x1, x2], writes=[result])
    return result


def dot(a, b, out=None):
    if a.ndim == 2 and b.ndim == 2:
        return matmul(a, b, out=out)
    _check_out(out)
    result = ndarray(np.asarray(np.dot(_operand(a), _operand(b))))
    TRACKER.launch(reads=[a, b], writes=[result])
    return result


def vdot(a, b):
    CALLS["vdot"] += 1
    result = ndarray(np.asarray(np.vdot(_operand(a), _operand(b))))
    TRACKER.launch(reads=[a, b], writes=[result])
    return result


def _sum(a, axis=None, dtype=None, out=None, keepdims=False):
    return _reduce(np.sum, a, axis, dtype=dtype, out=out, keepdims=keepdims)


def amax(a, axis=None, out=None, keepdims=False):
    return _reduce(np.max, a, axis, out=out, keepdims=keepdims)


def amin(a, axis=None, out=None, keepdims=False):
    return _reduce(np.min, a, axis, out=out, keepdims=keepdims)




def _all(a, axis=None, out=None, keepdims=False):
    return _reduce(np.all, a, axis, out=out, keepdims=keepdims)


def _any(a, axis=None, out=None, keepdims=False):
    return _reduce(np.any, a, axis, out=out, keepdims=keepdims)


def concatenate(tup, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _check_out(out)
    arrays = [_operand(x) for x in tup]
    result = ndarray(np.concatenate(arrays, axis=axis, dtype=dtype, casting=casting))
    if out is not None:
        out._a[...] = result._a
        result = out
    TRACKER.launch(reads=list(tup), writes=[result])
    return result


def flatnonzero(a):
    result = ndarray(np.flatnonzero(_operand(a)))
    TRACKER.launch(reads=[a], writes=[result])
    return result


def where(condition, x=None, y=None):
    if x is None and y is None:
        return tuple(ndarray(r) for r in np.nonzero(_operand(condition)))
    result = ndarray(np.where(_operand(condition), _operand(x), _operand(y)))
    TRACKER.launch(reads=[condition, x, y], writes=[result])
    return result


# the functions NumPy dispatches to (__array_function__) and the module exports, by CuPy's names
_NAMED = {"sum": _sum, "max": amax, "min": amin, "all": _all, "any": _any, "abs": _UFUNCS["absolute"]}
_FUNCTIONS = {**{name: globals()[name] for name in (
    "take", "unique", "matmul", "dot", "vdot", "amax", "amin", "concatenate", "flatnonzero", "where",
    "empty_like", "zeros_like", "ones_like", "full_like", "ascontiguousarray")}, **_NAMED}


# ---------------------------------------------------------------- cupyx: scatter

_SCATTER_TYPES = {"add": (np.int32, np.float16, np.float32, np.float64, np.uint32, np.uint64),
                  "max": (np.int32, np.float32, np.float64, np.uint32, np.uint64),
                  "min": (np.int32, np.float32, np.float64, np.uint32, np.uint64)}


def _scatter(a, slices, value, op):
    """cupyx.scatter_{add,max,min}(a, slices, value): numpy.{add,maximum,minimum}.at, with CuPy's
    dtype restrictions (atomics)."""
    CALLS[f"scatter_{op}"] += 1
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    idx = _index(slices)
    v = value._a if isinstance(value, ndarray) else np.asarray(value, dtype=a.dtype)
    if _advanced(slices) and not issubclass(v.astype(a.dtype, copy=False).dtype.type, _SCATTER_TYPES[op]):
        raise TypeError(f"scatter_{op} does not support {v.dtype} as data type")
    {"add": np.add, "max": np.maximum, "min": np.minimum}[op].at(a._a, idx, v.astype(a.dtype, copy=False))
    part = _touched(a, slices)
    TRACKER.launch(reads=[x for x in [value, part] + list(slices if isinstance(slices, tuple) else (slices,))
                          if isinstance(x, ndarray)], writes=[part])


def scatter_add(a, slices, value):
    a.scatter_add(slices, value)


def scatter_max(a, slices, value):
    a.scatter_max(slices, value)


def scatter_min(a, slices, value):
    a.scatter_min(slices, value)


# ---------------------------------------------------------------- ElementwiseKernel

COMPILER = None                   # set by install(): the C++ compiler of the source check
_CHECKED: dict = {}               # (source hash) -> None, or the compiler's message

# The CUDA C math API's functions the stand-in declares (and evaluates): float and double versions.
# (C++ overloads such as exp(float) or max(float, double) are left out on purpose.)
CUDA_MATH = {
    "expf": (np.exp, "float"), "exp": (np.exp, "double"), "logf": (np.log, "float"), "log": (np.log, "double"),
    "tanhf": (np.tanh, "float"), "tanh": (np.tanh, "double"), "powf": (np.power, "float"),
    "pow": (np.power, "double"), "fabsf": (np.abs, "float"), "fabs": (np.abs, "double"),
    "fmaxf": (np.fmax, "float"), "fmax": (np.fmax, "double"), "fminf": (np.fmin, "float"),
    "fmin": (np.fmin, "double"), "sqrtf": (np.sqrt, "float"), "sqrt": (np.sqrt, "double"),
    "expm1f": (np.expm1, "float"), "expm1": (np.expm1, "double"), "log1pf": (np.log1p, "float"),
    "log1p": (np.log1p, "double"),
}
_CTYPES = {"float": np.float32, "double": np.float64}
_DTYPE_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.float16): "half",
                np.dtype(np.int64): "long long", np.dtype(np.int32): "int", np.dtype(np.bool_): "bool",
                np.dtype(np.uint32): "unsigned int", np.dtype(np.uint64): "unsigned long long"}
_PREAMBLE_DEF = re.compile(r"(?:__device__\s+)?(?:(?:__forceinline__|inline|static)\s+)*(float|double)\s+(\w+)\s*"
                           r"\(([^)]*)\)\s*\{\s*return\s+([^;{}]+);\s*\}")


class _Param:
    def __init__(self, text, is_input):
        parts = text.split()
        self.raw = parts[0] == "raw"
        if self.raw:
            parts = parts[1:]
        if len(parts) != 2 or not parts[1].isidentifier():
            raise ValueError(f"Invalid parameter: {text!r}")
        self.type, self.name = parts
        if self.name == "i":
            raise ValueError("Can not use 'i' as a parameter name")
        if len(self.type) == 1:                # CuPy: a one-letter type is a type placeholder
            if not self.type.isalpha():
                raise ValueError(f"Invalid type placeholder: {self.type!r}")
            self.dtype = None
        else:
            self.dtype = np.dtype(self.type)   # a dtype name (TypeError if not one)
        self.is_input = is_input


def _parse_params(text, is_input):
    return [_Param(p.strip(), is_input) for p in text.split(",") if p.strip()] if text.strip() else []


class ElementwiseKernel:
    """cupy.ElementwiseKernel(in_params, out_params, operation, name='kernel', reduce_dims=True,
    preamble='', no_return=False, return_tuple=False, **kwargs)."""

    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True, preamble="",
                 no_return=False, return_tuple=False, **kwargs):
        CALLS["ElementwiseKernel"] += 1
        unknown = set(kwargs) - {"loop_prep", "after_loop", "options"}
        if unknown:
            raise TypeError(f"ElementwiseKernel got unexpected keyword arguments {sorted(unknown)}")
        if not name.isidentifier():
            raise ValueError(f"invalid kernel name {name!r}")
        self.in_params, self.out_params = _parse_params(in_params, True), _parse_params(out_params, False)
        names = [p.name for p in self.in_params + self.out_params]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate parameter names in {names}")
        if any(p.raw for p in self.in_params + self.out_params):
            raise NotImplementedError("the stand-in does not evaluate raw parameters")
        self.nin, self.nout = len(self.in_params), len(self.out_params)
        self.nargs = self.nin + self.nout
        self.operation, self.name, self.preamble = operation, name, preamble
        self.no_return, self.return_tuple = no_return, return_tuple
        self.kwargs = kwargs
        self._statements = _parse_operation(operation)
        self._functions = _parse_preamble(preamble)

    # -------- the source CuPy would compile, checked by a C++ compiler
    def source(self, types: dict) -> str:
        decls = "\n".join(f"{ct} {fn}({', '.join([ct] * (2 if fn.startswith(('pow', 'fmax', 'fmin')) else 1))});"
                          for fn, (_, ct) in CUDA_MATH.items())
        decls = 'extern "C" {\n' + decls + "\n}"
        typedefs = "\n".join(f"typedef {_DTYPE_CTYPE[dt]} {name};" for name, dt in types.items())
        ctype = lambda p: p.type if p.dtype is None else _DTYPE_CTYPE[p.dtype]     # noqa: E731
        params = [f"const {ctype(p)}* _raw_{p.name}" for p in self.in_params] + \
                 [f"{ctype(p)}* _raw_{p.name}" for p in self.out_params] + ["long long _n"]
        refs = [f"    const {ctype(p)} &{p.name} = _raw_{p.name}[i];" for p in self.in_params] + \
               [f"    {ctype(p)} &{p.name} = _raw_{p.name}[i];" for p in self.out_params]
        return "\n".join([
            "// CUDA device code, checked on the host: __device__ and friends defined away",
            "#define __device__", "#define __forceinline__ inline", "#define __global__",
            decls, typedefs, self.preamble,
            f'extern "C" void {self.name}({", ".join(params)}) {{',
            "  for (long long i = 0; i < _n; ++i) {", *refs, self.operation + "\n;", "  }", "}", ""])

    def check(self, types: dict) -> None:
        text = self.source(types)
        key = hashlib.sha256(text.encode()).hexdigest()
        if key not in _CHECKED:
            if COMPILER is None:
                raise RuntimeError("the stand-in's kernel check needs a C++ compiler (install() sets it)")
            proc = subprocess.run([COMPILER, "-x", "c++", "-std=c++17", "-fsyntax-only", "-Werror=double-promotion",
                                   "-Werror=float-conversion", "-Werror=return-type", "-"], input=text,
                                  capture_output=True, text=True, timeout=60)
            _CHECKED[key] = None if proc.returncode == 0 else proc.stderr.strip()
            CALLS["kernel source checked"] += 1
        if _CHECKED[key] is not None:
            numbered = "\n".join(f"{k + 1:4} {line}" for k, line in enumerate(text.splitlines()))
            raise CompileError(f"kernel {self.name!r} does not compile:\n{_CHECKED[key]}\n--- source ---\n{numbered}")

    # -------- a launch
    def __call__(self, *args, size=None, block_size=None, stream=None):
        CALLS["ElementwiseKernel.__call__"] += 1
        if len(args) not in (self.nin, self.nargs):
            raise TypeError(f"Wrong number of arguments for {self.name!r}. It must be either {self.nin} or "
                            f"{self.nargs} (with outputs), but given {len(args)}.")
        values = [_operand(a) for a in args]
        outs = list(args[self.nin:])
        for o in outs:
            if not isinstance(o, ndarray):
                raise TypeError("Output arguments type must be cupy.ndarray")
        params = self.in_params + self.out_params[:len(outs)]
        types: dict = {}
        for p, a in zip(params, args):
            if p.dtype is None and isinstance(a, ndarray):
                if types.setdefault(p.type, a.dtype) != a.dtype:
                    raise TypeError(f"Type is mismatched. {p.name} {a.dtype} {types[p.type]}")
        for p in self.in_params + self.out_params:
            if p.dtype is None and p.type not in types:
                raise TypeError(f"Cannot determine the type of {p.type!r} ({p.name})")
        shapes = [np.shape(v) for v in values if isinstance(v, np.ndarray)]
        shape = np.broadcast_shapes(*shapes) if shapes else ()
        for o in outs:
            if o.shape != shape:
                raise ValueError("Out shape is mismatched")
        if not outs:
            outs = [ndarray(np.empty(shape, dtype=types[p.type] if p.dtype is None else p.dtype))
                    for p in self.out_params]
        self.check(types)
        if size is None and 0 not in shape:
            env = {}
            for p, v in zip(self.in_params, values[:self.nin]):
                dt = types[p.type] if p.dtype is None else p.dtype
                env[p.name] = np.broadcast_to(np.asarray(v, dtype=dt), shape) if isinstance(v, np.ndarray) \
                    else dt.type(v)
            for p, o in zip(self.out_params, outs):
                env[p.name] = o._a
            _run_statements(self._statements, env, types, self._functions, {p.name for p in self.out_params})
        TRACKER.launch(reads=[a for a in args[:self.nin] if isinstance(a, ndarray)], writes=outs)
        if self.no_return:
            return None
        return outs[0] if len(outs) == 1 and not self.return_tuple else tuple(outs)


_STATEMENT = re.compile(r"^(?:const\s+)?(?:(\w+)\s+)?(\w+)\s*=\s*(.+)$", re.S)
_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Name, ast.Constant, ast.Load,
            ast.Add, ast.Sub, ast.Mult, ast.Div, ast.USub, ast.UAdd, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)


def _expression(text: str):
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise NotImplementedError(f"the stand-in evaluates + - * /, comparisons and calls only; not {text!r}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED) or (isinstance(node, ast.Compare) and len(node.ops) != 1) \
                or (isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name) or node.keywords)):
            raise NotImplementedError(f"the stand-in cannot evaluate {text!r} ({type(node).__name__})")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and all(
                isinstance(x, ast.Constant) and isinstance(x.value, int) for x in (node.left, node.right)):
            raise NotImplementedError(f"integer division in {text!r}: C and Python differ")
    return tree


def _parse_operation(operation: str) -> list:
    body = re.sub(r"//[^\n]*", "", operation)
    out = []
    for stmt in body.split(";"):
        stmt = stmt.strip()
        if not stmt:
            continue
        m = _STATEMENT.match(stmt)
        if not m:
            raise NotImplementedError(f"the stand-in evaluates `[type] name = expression;` statements; not {stmt!r}")
        declared, name, expr = m.groups()
        out.append((declared, name, _expression(expr)))
    return out


def _parse_preamble(preamble: str) -> dict:
    """{name: {ctype: (parameter names, expression)}} of one-line `return` functions."""
    text = re.sub(r"//[^\n]*", "", preamble)
    functions: dict = {}
    for m in _PREAMBLE_DEF.finditer(text):
        ret, name, params, expr = m.groups()
        names, types_ = [], []
        for p in filter(None, (x.strip() for x in params.split(","))):
            t, n = p.rsplit(None, 1)
            types_.append(t.replace("const", "").strip())
            names.append(n)
        if any(t != ret for t in types_):
            raise NotImplementedError(f"the stand-in evaluates preamble functions of one type: {m.group(0)!r}")
        functions.setdefault(name, {})[ret] = (names, _expression(expr))
    rest = _PREAMBLE_DEF.sub("", text).strip()
    if rest:
        raise NotImplementedError(f"the stand-in evaluates one-line `return` functions in a preamble; not {rest!r}")
    return functions


def _ctype_of(values) -> str | None:
    for v in values:
        dt = getattr(v, "dtype", None)
        if dt is not None and dt.kind == "f":
            return _DTYPE_CTYPE[np.dtype(dt)]
    return None


def _evaluate(tree, env, types, functions):
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, float):
                return np.float64(node.value)          # a C double literal
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise NameError(f"{node.id!r} is not defined in the kernel")
            return env[node.id]
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            op = type(node.op)
            return {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.divide}[op](a, b)
        if isinstance(node, ast.Compare):
            a, b = ev(node.left), ev(node.comparators[0])
            return {ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater, ast.GtE: np.greater_equal,
                    ast.Eq: np.equal, ast.NotEq: np.not_equal}[type(node.ops[0])](a, b)
        if isinstance(node, ast.Call):
            name, args = node.func.id, [ev(a) for a in node.args]
            if name in types:                           # T(x): a cast to the placeholder's type
                return np.asarray(args[0]).astype(types[name])[()]
            if name in ("float", "double"):
                return np.asarray(args[0]).astype(_CTYPES[name])[()]
            if name in functions:
                overloads = functions[name]
                ct = _ctype_of(args)
                if ct not in overloads:
                    raise TypeError(f"no overload of {name} for {ct} arguments (has {sorted(overloads)})")
                params, body = overloads[ct]
                local = dict(zip(params, [np.asarray(a).astype(_CTYPES[ct])[()] for a in args]))
                return np.asarray(_evaluate(body, local, types, functions)).astype(_CTYPES[ct])[()]
            if name in CUDA_MATH:
                fn, ct = CUDA_MATH[name]
                cast = [np.asarray(a).astype(_CTYPES[ct])[()] for a in args]
                return np.asarray(fn(*cast)).astype(_CTYPES[ct])[()]
            raise NameError(f"{name!r} is not a function the kernel can call")
        raise NotImplementedError(type(node).__name__)
    return ev(tree)


def _run_statements(statements, env, types, functions, outputs):
    env = dict(env)
    for declared, name, tree in statements:
        value = _evaluate(tree, env, types, functions)
        if declared is not None:
            dt = types.get(declared) or (_CTYPES.get(declared) and np.dtype(_CTYPES[declared]))
            if dt is None:
                raise NotImplementedError(f"the stand-in knows the placeholders and float/double, not {declared!r}")
            env[name] = np.asarray(value).astype(dt)
        elif name in outputs:
            env[name][...] = value
        elif name in env and isinstance(env[name], np.ndarray) and env[name].flags.writeable:
            env[name] = np.asarray(value).astype(env[name].dtype)
        else:
            raise NameError(f"assignment to {name!r}, which is neither an output nor a declared variable")


# ---------------------------------------------------------------- the modules

_EXPORTS = (
    "ndarray", "ufunc", "ElementwiseKernel", "get_default_memory_pool", "array", "asarray", "ascontiguousarray",
    "asnumpy", "empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like", "arange",
    "take", "unique", "matmul", "dot", "vdot", "amax", "amin", "concatenate", "flatnonzero", "where", "inf", "nan", "newaxis", "pi", "e", "float16", "float32", "float64", "int8",
    "int16", "int32", "int64", "uint8", "uint32", "uint64", "bool_", "intp", "dtype", "isscalar") + _UFUNC_NAMES


def modules() -> dict:
    """{module name: module} of the stand-in: cupy, cupy.cuda, cupy.cuda.runtime, cupyx."""
    this = sys.modules[__name__]
    cp = types.ModuleType("cupy")
    cp.__doc__ = "stand-in CuPy over NumPy (tests/engine/cupy_standin.py)"
    cp.__version__ = "0.0-standin"
    for n in _EXPORTS:
        setattr(cp, n, getattr(this, n))
    for n, fn in _NAMED.items():
        setattr(cp, n, fn)
    cuda = types.ModuleType("cupy.cuda")
    cuda.Stream, cuda.Event, cuda.Device = Stream, Event, Device
    cuda.get_current_stream = get_current_stream
    cuda.runtime = _runtime_module()
    cuda.get_elapsed_time = lambda start, end: 0.0
    cp.cuda = cuda
    cpx = types.ModuleType("cupyx")
    cpx.scatter_add, cpx.scatter_max, cpx.scatter_min = scatter_add, scatter_max, scatter_min
    return {"cupy": cp, "cupy.cuda": cuda, "cupy.cuda.runtime": cuda.runtime, "cupyx": cpx}


def install(monkeypatch, compiler: str) -> dict:
    """Puts the stand-in in sys.modules (undone with the monkeypatch), fresh streams and counters."""
    global COMPILER
    COMPILER = compiler
    TRACKER.reset()
    _new_null_stream()
    CALLS.clear()
    mods = modules()
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)
    return mods
