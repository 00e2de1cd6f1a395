"""The CuPy backend against the NumPy backend: same loss and gradients for every model and every
switch, and fused CUDA kernels counted like the CPU's. Skipped cleanly where no CUDA GPU is usable;
`make gpu-check` also runs the whole suite with CAVS_BACKEND=cupy."""
import numpy as np
import pytest

import cavs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("workload", cavs.workloads.WORKLOADS)
@pytest.mark.parametrize("fusion,streaming", [(False, False), (True, True)])
def test_cupy_equals_numpy(workload, fusion, streaming, small_samples):
    model = cavs.models.build(workload, hidden=6, seed=2, dtype="float64", leaves=8)
    batch = model.make_batch(small_samples[workload])
    cpu = cavs.Engine(model, backend="numpy").loss_and_grads(batch)
    gpu = cavs.Engine(model, backend="cupy", fusion=fusion, streaming=streaming).loss_and_grads(batch)
    assert gpu[0] == pytest.approx(cpu[0], rel=1e-9)
    for name, g in cpu[1].items():
        assert np.abs(gpu[1][name] - g).max() <= 1e-6 * max(1.0, np.abs(g).max()), name


def test_fused_cuda_kernel_counts_match_the_cpu_plan():
    model = cavs.models.build("tree_lstm", hidden=4, dtype="float64")
    batch = model.make_batch(["(1 (2 a) (3 (2 b) (2 c)))"])
    counts = []
    for backend in ("numpy", "cupy"):
        engine = cavs.Engine(model, backend=backend, fusion=True, streaming=False)
        engine.loss_and_grads(batch)
        counts.append(dict(engine.counters.kernels))
    assert counts[0] == counts[1]
    assert counts[1]["fused"] == 7
