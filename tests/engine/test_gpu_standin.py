"""The CuPy backend's code paths, run on machines without a GPU through a stand-in for CuPy over
NumPy (tests/engine/cupy_standin.py): cavs/backend/cupy.py, fusion.py's CUDA kernels (their C++
source checked by a compiler, then evaluated), loss.py's GPU loss and the engine's streaming, on
every model of cavs.models and more (tests/engine/gpu_cases.py), against the NumPy backend.

What it cannot show: CUDA's own compiler (NVRTC) on these sources, timings, real asynchrony (work
runs at once; the stand-in checks that the streams are ordered by events), atomics' summation
order. test_gpu.py runs the same cases on a real GPU (`make gpu-check`).

Skipped where no C++ compiler is found (the kernel check needs one)."""
from __future__ import annotations

import functools
import shutil
import sys

import numpy as np
import pytest

import cavs
import cavs.backend
from cavs import fusion
from tests.engine import cupy_standin as standin_module
from tests.engine import gpu_cases as G
from tests.engine.helpers import TREE

COMPILER = next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler (g++, c++ or clang++) for the "
                                                        "stand-in's check of the CUDA kernels' source")


def _forget_backend():
    sys.modules.pop("cavs.backend.cupy", None)
    if hasattr(cavs.backend, "cupy"):
        delattr(cavs.backend, "cupy")
    fusion.compile_cupy.cache_clear()


@pytest.fixture
def standin(monkeypatch):
    """The stand-in as `cupy` / `cupyx`, and the engine allowed to choose backend="cupy"."""
    _forget_backend()
    mods = standin_module.install(monkeypatch, COMPILER)
    monkeypatch.setattr(cavs.backend, "gpu_available", lambda: True)
    yield mods["cupy"]
    _forget_backend()


@functools.lru_cache(maxsize=None)
def _case(name, dtype="float64"):
    model, samples = G.case(name, dtype)
    return model, samples, G.reference(model, samples)


def _matrix():
    """Every switch combination on three models (the Tree-LSTM, the child-sum on edges, every op),
    the corners (off, fusion, fusion + streaming, all on) on the others."""
    full = ("tree_lstm", "child_sum_edges", "every_op")
    return [pytest.param(name, opts, id=f"{name}-{G.switch_id(opts)}")
            for name in G.MODELS for opts in (G.ALL_SWITCHES if name in full else G.CORNERS)]


@pytest.mark.parametrize("name,opts", _matrix())
def test_cupy_backend_equals_numpy(standin, name, opts):
    model, samples, ref = _case(name)
    engine = cavs.Engine(model, backend="cupy", **opts)
    assert type(engine.backend).__module__ == "cavs.backend.cupy" and engine.xp is standin
    G.compare(engine.loss_and_grads(model.make_batch(samples)), ref)
    if opts["fusion"]:
        assert engine.counters.kernels["fused"] > 0
        assert standin_module.CALLS["ElementwiseKernel.__call__"] > 0
    if opts["streaming"] and (engine.forward_phases["eager"] or engine.backward_phases["eager"]):
        assert standin_module.CALLS["Stream.wait_event"] > 0      # the eager phase ran on the side stream


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_rows_reduce_each_vertexs_edges(standin, dtype):
    from cavs.backend.cupy import CupyBackend
    G.check_segment_rows(CupyBackend(), standin, dtype)


@pytest.mark.parametrize("name", ["tree_lstm", "var_lstm", "child_sum_edges"])
def test_float32_kernels_compute_in_float(standin, name):
    """float32: the kernels' source is checked with `typedef float T` (a double literal or a
    double function in it fails the check), and the numbers match NumPy's float32."""
    model, samples, ref = _case(name, "float32")
    got = cavs.Engine(model, backend="cupy").loss_and_grads(model.make_batch(samples))
    G.compare(got, ref, rtol=1e-5, gtol=2e-4)


def test_fused_kernel_counts_match_the_cpu_plan(standin):
    from tests.engine.test_fusion import KERNELS_FUSED
    model = cavs.models.build("tree_lstm", hidden=4, dtype="float64")
    batch = model.make_batch([TREE])
    counts = []
    for backend in ("numpy", "cupy"):
        engine = cavs.Engine(model, backend=backend, fusion=True, streaming=False)
        standin_module.CALLS.clear()
        engine.loss_and_grads(batch)
        counts.append(dict(engine.counters.kernels))
    # the GPU has no row kernels: [hl; hr] and the two child-gradient concats are copied there
    assert counts[0] == KERNELS_FUSED and counts[1] == {**KERNELS_FUSED, "concat": 6}
    assert standin_module.CALLS["ElementwiseKernel.__call__"] == KERNELS_FUSED["fused"]


@pytest.mark.parametrize("name", ["tree_lstm", "child_sum_edges"])
def test_training_steps_and_predictions_equal_numpy(standin, name):
    """SGD (clipped) and Adagrad steps, the sparse embedding update, predict's softmax."""
    G.check_training_steps(name)


def test_every_backend_call_was_exercised(standin):
    """The cases reach every CuPy call the backend, the kernels and the loss make."""
    for name in ("tree_lstm", "child_sum_edges", "every_op", "attention"):
        model, samples, _ = _case(name)
        engine, batch = cavs.Engine(model, backend="cupy"), model.make_batch(samples)
        engine.loss_and_grads(batch)
        engine.step(batch)
    used = set(standin_module.CALLS)
    wanted = {"take", "scatter_add", "scatter_max", "matmul", "asnumpy", "array", "vdot",
              "ElementwiseKernel", "ElementwiseKernel.__call__", "Stream",
              "Stream.__enter__", "Stream.wait_event", "Event.record", "Stream.synchronize", "get_current_stream"}
    assert wanted <= used, sorted(wanted - used)


# ---------------------------------------------------------------- what must fail

def test_streams_that_are_not_ordered_by_events_are_caught(standin, monkeypatch):
    from cavs.backend.cupy import CupyBackend
    model, samples, _ = _case("tree_lstm")
    batch = model.make_batch(samples)

    def no_wait(self, chunks):                  # the loop never waits for the side stream
        side = standin.cuda.Stream(non_blocking=True)
        side.wait_event(standin.cuda.get_current_stream().record())
        with side:
            for fns in chunks:
                for fn in fns:
                    fn()
        return lambda k: None

    def late_inputs(self, chunks):              # the side stream does not wait for its inputs
        side, main = standin.cuda.Stream(non_blocking=True), standin.cuda.get_current_stream()
        events = []
        with side:
            for fns in chunks:
                for fn in fns:
                    fn()
                events.append(side.record())
        return lambda k: main.wait_event(events[k])

    for broken in (no_wait, late_inputs):
        monkeypatch.setattr(CupyBackend, "stream", broken)
        with pytest.raises(standin_module.StreamHazard):
            cavs.Engine(model, backend="cupy", streaming=True).loss_and_grads(batch)


def test_a_malformed_or_double_kernel_source_fails(standin, monkeypatch):
    k = standin.ElementwiseKernel
    x = standin.asarray(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    out = standin.empty_like(x)
    good = k("T in0", "T out0", "T v1 = (T(0.5) * cavs_tanh(T(0.5) * in0) + T(0.5));\nout0 = v1;", "cavs_fused",
             preamble=fusion.CUPY_PREAMBLE)
    good(x, out)
    np.testing.assert_allclose(standin.asnumpy(out), 0.5 * np.tanh(0.5 * standin.asnumpy(x)) + 0.5, rtol=1e-6)
    bad = {
        "double literal in a float kernel": "T v1 = (0.5 * cavs_tanh(0.5 * in0) + 0.5);\nout0 = v1;",
        "a C++ overload NVRTC may lack": "T v1 = max(in0, T(0.0));\nout0 = v1;",
        "a double function on a float": "T v1 = tanh(in0);\nout0 = v1;",
        "an unknown name": "T v1 = cavs_tanhh(in0);\nout0 = v1;",
        "a missing semicolon": "T v1 = in0 * T(2.0)\nT v2 = v1;\nout0 = v2;",
        "an undeclared variable": "out0 = v7;",
    }
    for why, body in bad.items():
        with pytest.raises((standin_module.CompileError, NotImplementedError, NameError)):
            k("T in0", "T out0", body, "cavs_fused", preamble=fusion.CUPY_PREAMBLE)(x, out)
    # the engine's own kernels: a broken source fails the engine's pass
    monkeypatch.setattr(fusion, "cupy_source", lambda g: ("T in0", "T out0", "T v1 = in0 +;\nout0 = v1;"))
    model, samples, _ = _case("tree_fc")
    with pytest.raises((standin_module.CompileError, NotImplementedError, TypeError, ValueError)):
        cavs.Engine(model, backend="cupy", fusion=True).loss_and_grads(model.make_batch(samples))


def test_a_renamed_or_misused_cupy_call_fails(standin, monkeypatch):
    cp, cpx = standin, sys.modules["cupyx"]
    a = cp.zeros((4, 3))
    idx = cp.asarray(np.array([0, 2, 2]))
    with pytest.raises(AttributeError):
        cp.take_rows(a, idx)
    with pytest.raises(AttributeError):
        cpx.scatter_maximum(a, idx, cp.ones((3, 3)))
    with pytest.raises(TypeError):
        cp.take(a, idx, axis=0, output=cp.empty((3, 3)))
    with pytest.raises(ValueError):
        cp.take(a, idx, axis=0, out=cp.empty((2, 3)))           # CuPy checks out's shape
    with pytest.raises(TypeError):
        cp.take(a, idx, axis=0, out=cp.empty((3, 3), dtype=np.float32))    # and its dtype
    with pytest.raises(TypeError):
        cp.cuda.Stream(nonblocking=True)
    with pytest.raises(TypeError):
        cp.cuda.Stream().wait_event(cp.cuda.Stream())
    with pytest.raises(TypeError):
        np.asarray(a)                                          # implicit conversion to NumPy
    with pytest.raises(TypeError):
        a + np.ones(3)                                         # a NumPy array into a ufunc
    with pytest.raises(ValueError):
        a[:2] = np.ones((2, 3))                                # a NumPy array through basic indexing
    with pytest.raises(TypeError):
        cp.multiply(a, 2.0, out=np.empty((4, 3)))
    kernel = cp.ElementwiseKernel("T in0", "T out0", "out0 = in0;", "copy")
    with pytest.raises(TypeError):
        kernel(np.ones((4, 3)), a)                             # NumPy input to a kernel
    with pytest.raises(ValueError):
        kernel(a, cp.empty((2, 3)))                            # out shape mismatch
    with pytest.raises(TypeError):
        kernel(a.astype(np.float32), a)                        # T bound to two dtypes
    with pytest.raises(TypeError):
        cpx.scatter_add(cp.zeros(3, dtype=np.int64), cp.asarray(np.array([0])), 1)   # no int64 atomics
    a[idx] = np.ones((3, 3))                                   # (a NumPy value through a scatter: converted)
    # the engine on a backend with a renamed call fails
    from cavs.backend.cupy import CupyBackend

    def renamed(self, dst, idx, src):
        dst[cp.unique(idx)] = -cp.inf
        sys.modules["cupyx"].scatter_maximum(dst, idx, src)
    monkeypatch.setattr(CupyBackend, "max_rows", renamed)
    model, samples, _ = _case("attention")          # kids.softmax: max_rows
    with pytest.raises(AttributeError):
        cavs.Engine(model, backend="cupy").loss_and_grads(model.make_batch(samples))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("tid,op,attrs,broadcast", G.templates(), ids=[t[0] for t in G.templates()])
def test_every_expression_template_as_a_cuda_kernel(standin, tid, op, attrs, broadcast, dtype):
    """Each elementwise op of ops.py, alone in a fused kernel (as fusion.cupy_source writes it),
    checked for float and double and evaluated: equal to the op's NumPy implementation."""
    group, shapes = G.template_group(op, attrs, broadcast)
    values = G.template_inputs(op, shapes, dtype=dtype)
    kernel = fusion.compile_cupy(*fusion.cupy_source(group))
    out = standin.empty((values[0].shape[0], group.width), dtype=dtype)
    kernel(*[standin.asarray(v) for v in values], out)
    want = G.template_reference(op, attrs, values)
    np.testing.assert_allclose(standin.asnumpy(out), want, rtol=1e-12 if dtype == "float64" else 2e-6, atol=1e-30)
