"""What the engine derives from F and dF before any batch (cavs/analysis.py): the phases (lazy
batching: one parameter-gradient product per parameter; eager batching: the input product once
before the loop) and the affine sums of GEMM epilogue fusion (the bias written where no product
computes, the terms in phase order), pinned by kernel counts and by the unfused numbers."""
import numpy as np
import pytest

import cavs
from tests.conftest import backend_name
from tests.engine.helpers import TREE, run


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
