"""The CuPy backend on a real CUDA GPU against the NumPy backend: every expression template as a
CUDA kernel (NVRTC), fused kernel counts, then every model of cavs.models (and attention, every op)
under the switch corners and all 16 switch combinations, float32, training steps and predictions.
The same cases as test_gpu_standin.py (tests/engine/gpu_cases.py), which runs them on machines
without a GPU through a stand-in for CuPy.

Skipped cleanly where no CUDA GPU with CuPy is usable (tests/conftest.py). `make gpu-check` runs
this file first (experiments/gpu_check.py); it sets CAVS_GPU_TEST_DEADLINE (a Unix time), after
which the remaining tests are skipped (marked as such in the report) so that the sweep still runs
within the device time. The tests are in order of what they tell first."""
from __future__ import annotations

import functools
import os
import time

import numpy as np
import pytest

import cavs
from tests.engine import gpu_cases as G
from tests.engine.helpers import TREE

pytestmark = pytest.mark.gpu
DEADLINE_ENV = "CAVS_GPU_TEST_DEADLINE"


@pytest.fixture(autouse=True)
def _deadline():
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline and time.time() > float(deadline):
        pytest.skip(f"the device-time budget for tests is spent ({DEADLINE_ENV})")


@functools.lru_cache(maxsize=None)
def _case(name, dtype="float64"):
    model, samples = G.case(name, dtype)
    return model, samples, G.reference(model, samples)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tid,op,attrs,broadcast", G.templates(), ids=[t[0] for t in G.templates()])
def test_every_expression_template_as_a_cuda_kernel(tid, op, attrs, broadcast, dtype):
    import cupy
    from cavs import fusion
    group, shapes = G.template_group(op, attrs, broadcast)
    values = G.template_inputs(op, shapes, dtype=dtype)
    kernel = fusion.compile_cupy(*fusion.cupy_source(group))
    out = cupy.empty((values[0].shape[0], group.width), dtype=dtype)
    kernel(*[cupy.asarray(v) for v in values], out)
    want = G.template_reference(op, attrs, values)
    # CUDA's float functions are within a few ulp of NumPy's (expf, tanhf: 2 ulp)
    np.testing.assert_allclose(cupy.asnumpy(out), want, rtol=1e-12 if dtype == "float64" else 5e-6, atol=1e-30)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_rows_reduce_each_vertexs_edges(dtype):
    """The maximum exactly one of the edges' values (edge_max's gradient needs it), the sums close."""
    import cupy
    from cavs.backend.cupy import CupyBackend
    G.check_segment_rows(CupyBackend(), cupy, dtype)


def test_fused_cuda_kernel_counts_match_the_cpu_plan():
    from tests.engine.test_fusion import KERNELS_FUSED
    model = cavs.models.build("tree_lstm", hidden=4, dtype="float64")
    batch = model.make_batch([TREE])
    counts = []
    for backend in ("numpy", "cupy"):
        engine = cavs.Engine(model, backend=backend, fusion=True, streaming=False)
        engine.loss_and_grads(batch)
        counts.append(dict(engine.counters.kernels))
    # the GPU has no row kernels: [hl; hr] and the two child-gradient concats are copied there
    assert counts[0] == KERNELS_FUSED and counts[1] == {**KERNELS_FUSED, "concat": 6}


@pytest.mark.parametrize("name,opts", [pytest.param(n, o, id=f"{n}-{G.switch_id(o)}")
                                       for n in G.MODELS for o in G.CORNERS])
def test_cupy_equals_numpy_switch_corners(name, opts):
    model, samples, ref = _case(name)
    engine = cavs.Engine(model, backend="cupy", **opts)
    G.compare(engine.loss_and_grads(model.make_batch(samples)), ref)


@pytest.mark.parametrize("name", ["tree_lstm", "fixed_lstm", "var_lstm", "tree_fc", "child_sum_edges"])
def test_float32_equals_numpy(name):
    """float32, the sweep's dtype, with the default switches (so CuPy's cache holds the sweep's
    kernels afterwards: a kernel's source does not depend on the sizes)."""
    model, samples, ref = _case(name, "float32")
    got = cavs.Engine(model, backend="cupy").loss_and_grads(model.make_batch(samples))
    G.compare(got, ref, rtol=1e-5, gtol=2e-4)


@pytest.mark.parametrize("name", ["tree_lstm", "child_sum_edges"])
def test_training_steps_and_predictions_equal_numpy(name):
    G.check_training_steps(name)


FULL = ("tree_lstm", "child_sum_edges", "every_op", "fixed_lstm", "var_lstm", "tree_fc", "child_sum_slots",
        "attention")


@pytest.mark.parametrize("name,opts", [pytest.param(n, o, id=f"{n}-{G.switch_id(o)}")
                                       for n in FULL for o in G.ALL_SWITCHES if o not in G.CORNERS])
def test_cupy_equals_numpy_every_switch_combination(name, opts):
    model, samples, ref = _case(name)
    engine = cavs.Engine(model, backend="cupy", **opts)
    G.compare(engine.loss_and_grads(model.make_batch(samples)), ref)
