"""Lazy batching, eager batching, streaming and fusion change speed, never the numbers; and the
kernel counts they produce are pinned, so a fusion or batching regression is a failing count."""
import itertools

import numpy as np
import pytest

import cavs
from tests.conftest import backend_name

SWITCHES = ("lazy", "eager", "fusion", "streaming")


def run(workload, samples, **options):
    model = cavs.models.build(workload, hidden=6, seed=4, dtype="float64", leaves=8)
    engine = cavs.Engine(model, backend=backend_name(), **options)
    return engine.loss_and_grads(model.make_batch(samples)), engine


@pytest.mark.parametrize("workload", cavs.workloads.WORKLOADS)
def test_every_switch_combination_gives_the_same_numbers(workload, small_samples):
    samples = small_samples[workload]
    (base_loss, base_grads), _ = run(workload, samples, **dict.fromkeys(SWITCHES, False))
    for values in itertools.product([False, True], repeat=len(SWITCHES)):
        options = dict(zip(SWITCHES, values))
        (loss, grads), _ = run(workload, samples, **options)
        # reordering only (lazy, eager, streaming): 1e-9; fusion changes the arithmetic: 1e-6
        tol = 1e-6 if options["fusion"] else 1e-9
        assert loss == pytest.approx(base_loss, rel=tol), options
        for name, g in grads.items():
            err = np.abs(g - base_grads[name]).max() / max(1e-300, np.abs(base_grads[name]).max())
            assert err <= tol, f"{workload} {options}: d/d{name} relative error {err:.1e}"


TREE = "(1 (2 a) (3 (2 b) (2 c)))"     # 3 tasks: the 3 leaves, the inner vertex, the root

# Per batch of TREE (Tree-LSTM, lazy and eager on). Leaves skip what their missing children make
# zero: [hl; hr] Uh, the forget gates, the child gradients. Concat elision: [h; c] and the gate
# gradients are written in place by their parts, so only [hl; hr] (2 inner tasks) and the two
# child-gradient concats (2 inner tasks each) copy.
# An add of which one input is known zero on a task passes the other through (support.PASS): a
# copy, and the zero input is neither computed nor zero-filled. Unfused, that is x Wx + [hl; hr] Uh
# on all 3 tasks (one side is zero on each) and i*u + fl*cl + fr*cr at the leaves (2 adds): 5
# copies instead of 5 adds, and 4 zero-fills fewer (the zero sides).
KERNELS_UNFUSED = {"pull": 1, "matmul": 3, "zero-fill": 2, "add": 13, "copy": 5, "sigmoid": 10, "tanh": 6,
                   "mul": 30, "concat": 6, "gather": 4, "loss": 1, "tanh_grad": 6,
                   "sigmoid_grad": 10, "matmul_t": 3, "scatter": 4, "bias_grad": 1, "param_grad": 2}
# fused: the gate pre-activations x Wx + [hl; hr] Uh + b are written by their matmuls into one
# buffer (x Wx with the bias on the leaves, [hl; hr] Uh with the bias on the inner tasks): no
# add kernel, and neither matmul's known-zero rows are filled (2 zero-fills fewer: the leaf
# task's [hl; hr] Uh, the inner tasks' x Wx in one range). Then the cell's 12 elementwise ops
# (one group) and dF's 16 (one group) per task; at the leaves, where some members are skipped,
# the members that compute still run as one (smaller) kernel, in which the adds of c = i*u +
# fl*cl + fr*cr pass i*u through (support.PASS), so fl*cl and fr*cr are not zero-filled there
# (2 zero-fills fewer than before the pass-through)
KERNELS_FUSED = {"pull": 1, "matmul": 3, "zero-fill": 2, "fused": 6, "concat": 6, "gather": 4, "loss": 1,
                 "matmul_t": 3, "scatter": 4, "bias_grad": 1, "param_grad": 2}


@pytest.mark.parametrize("fusion,expected", [(False, KERNELS_UNFUSED), (True, KERNELS_FUSED)])
def test_exact_kernel_counts(fusion, expected):
    _, engine = run("tree_lstm", [TREE], fusion=fusion)
    assert dict(engine.counters.kernels) == expected
    assert engine.counters.total_kernels == sum(expected.values())


@pytest.mark.parametrize("lazy,param_grads,bias_grads", [(True, 2, 1), (False, 3, 3)])
def test_lazy_batching_issues_one_parameter_gradient_matmul_per_parameter(lazy, param_grads, bias_grads):
    """Lazy: dWx and dUh are one matmul each over all rows, db one sum. Without it, dUh is one
    matmul per internal task (2) and db one sum per task (3); dWx has only the leaf task."""
    _, engine = run("tree_lstm", [TREE, TREE], lazy=lazy)
    assert engine.counters.kernels["param_grad"] == param_grads
    assert engine.counters.kernels["bias_grad"] == bias_grads


def test_eager_batching_runs_input_matmul_once_before_the_loop():
    _, on = run("var_lstm", [[1, 2, 3, 4], [5, 6, 7]], eager=True)
    _, off = run("var_lstm", [[1, 2, 3, 4], [5, 6, 7]], eager=False)
    # x Wx: once over all rows, or once per task (3 tasks); h Wh: once per task after the first
    assert on.counters.kernels["matmul"] == 1 + 2
    assert off.counters.kernels["matmul"] == 3 + 2


@pytest.mark.parametrize("workload", ["tree_lstm", "var_lstm"])
def test_float32_fused_kernels_match_unfused(workload, small_samples):
    """The benchmarks' path: float32 kernels with Eigen's rational tanh, vectorized, writing into
    concat columns; against NumPy's per-op loops. The tanh differs by about 2 ulp."""
    def loss_and_grads(fusion):
        model = cavs.models.build(workload, hidden=16, seed=4, dtype="float32", leaves=8)
        engine = cavs.Engine(model, backend=backend_name(), fusion=fusion)
        return engine.loss_and_grads(model.make_batch(small_samples[workload]))

    (loss, grads), (ref_loss, ref_grads) = loss_and_grads(True), loss_and_grads(False)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for name, g in ref_grads.items():
        err = float(np.abs(grads[name] - g).max()) / max(1e-30, float(np.abs(g).max()))
        assert err <= 1e-4, f"d/d{name}: relative error {err:.1e}"


def test_affine_sum_writes_bias_where_no_matmul_computes():
    """GEMM epilogue fusion on every path, task by task: leaves without words (neither x Wx nor
    [hl; hr] Uh computes: the bias is filled in), a vertex with a word and children (x Wx writes
    with the bias, [hl; hr] Uh accumulates), a vertex with children only ([hl; hr] Uh writes
    with the bias); the same numbers as unfused, gradients included."""
    from cavs.graphs import Graph, make_forest
    from cavs import Batch
    g = Graph(np.array([[-1, -1], [-1, -1], [0, 1], [2, 1]]), np.array([-1, -1, 5, -1]),
              np.array([1, 2, 3, 0]), "hand-made DAG")
    results = {}
    for fusion in (False, True):
        model = cavs.models.build("tree_lstm", hidden=6, seed=4, dtype="float64")
        engine = cavs.Engine(model, backend=backend_name(), fusion=fusion)
        engine.params["b"] = np.random.default_rng(0).uniform(-1, 1, engine.params["b"].shape)
        results[fusion] = engine.loss_and_grads(Batch(make_forest([g], 2)))
        if fusion:
            assert engine.counters.kernels["bias-fill"] == 1
    (loss0, grads0), (loss1, grads1) = results[False], results[True]
    assert loss1 == pytest.approx(loss0, rel=1e-12)
    for name in grads0:
        np.testing.assert_allclose(grads1[name], grads0[name], rtol=1e-10, atol=1e-14, err_msg=name)


def test_affine_sum_terms_run_in_phase_order_not_trace_order(small_samples):
    """`h Wh + x Wx + b`: x Wx is traced second but runs first (eager, before the loop), so it
    must be the term that writes with the bias and h Wh the one that accumulates."""
    from cavs import concat, sigmoid, tanh

    def h_first(v, p):
        x = v.pull()
        h_prev, c_prev = v.gather(0).split(2)
        i, f, o, u = (h_prev @ p.Wh + x @ p.Wx + p.b).split(4)
        c = sigmoid(f) * c_prev + sigmoid(i) * tanh(u)
        h = sigmoid(o) * tanh(c)
        v.scatter(concat(h, c))
        v.push(h)

    lm = cavs.models.build("var_lstm", hidden=6)      # its vocabulary and reader of PTB samples
    samples = small_samples["var_lstm"]
    results = {}
    for options in ({"fusion": False}, {"fusion": True, "eager": True}, {"fusion": True, "eager": False}):
        model = cavs.Model(h_first, {"Wx": (6, 24), "Wh": (6, 24), "b": (24,)}, arity=1, state=12,
                           embedding=(lm.vocab, 6), classes=lm.classes, reader=lm.reader, seed=4, dtype="float64")
        engine = cavs.Engine(model, backend=backend_name(), **options)
        results[tuple(options.items())] = engine.loss_and_grads(model.make_batch(samples))
    (loss0, grads0), *rest = results.values()
    for loss, grads in rest:
        assert loss == pytest.approx(loss0, rel=1e-12)
        for name in grads0:
            np.testing.assert_allclose(grads[name], grads0[name], rtol=1e-10, atol=1e-14, err_msg=name)
