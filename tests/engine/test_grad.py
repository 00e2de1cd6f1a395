"""The gradient function dF (cavs/grad.py): every gradient rule checked by central finite differences
in float64, on real samples, tiny hand-made graphs (DAGs, repeated children, overlapping slices)
and the child-sum model on n-ary trees; a missing rule is named when the model is built."""
import numpy as np
import pytest

import cavs
from cavs import Model
from tests.conftest import backend_name
from tests.engine.helpers import dag, dag_batch, finite_differences, nary_trees


def finite_difference_check(engine, batch, rng, per_param=12, eps=1e-6, rtol=1e-6):
    """Compares engine gradients with central differences on a sample of entries per parameter."""
    loss, grads = engine.loss_and_grads(batch)
    for name, g in grads.items():
        p = engine.params[name]
        flat = np.flatnonzero(np.abs(g) > 0) if name == "emb" else np.arange(p.size)
        for i in rng.choice(flat, size=min(per_param, len(flat)), replace=False):
            idx = np.unravel_index(i, p.shape)
            orig = p[idx]
            for sign in (+1, -1):
                q = engine.params[name]
                q[idx] = orig + sign * eps
                engine.params[name] = q
                if sign > 0:
                    up = engine.infer(batch)
                else:
                    down = engine.infer(batch)
            q = engine.params[name]
            q[idx] = orig
            engine.params[name] = q
            numeric = (up - down) / (2 * eps)
            assert g[idx] == pytest.approx(numeric, rel=rtol, abs=1e-7 * max(1.0, abs(loss))), \
                f"d loss / d {name}{idx}: engine {g[idx]}, finite difference {numeric}"


@pytest.mark.parametrize("workload", cavs.workloads.WORKLOADS)
def test_model_gradients_match_finite_differences(workload, small_samples):
    model = cavs.models.build(workload, hidden=5, seed=2, dtype="float64", leaves=8)
    engine = cavs.Engine(model, backend=backend_name())
    finite_difference_check(engine, model.make_batch(small_samples[workload][:3]), np.random.default_rng(0))


# --- every op of the gradient table, in small vertex functions over Tree-FC's parameters (W, b)

def cell_relu_sub(v, p):
    h = cavs.relu(cavs.concat(v.gather(0), v.gather(1)) @ p.W - p.b + v.pull())
    v.scatter(h)
    v.push(h)


def cell_mul_neg_sigmoid(v, p):
    a = cavs.concat(v.gather(0), v.gather(1)) @ p.W
    h = cavs.sigmoid(-(a * p.b) + v.pull() * a) - v.gather(0)
    v.scatter(h)
    v.push(h)


def cell_overlapping_slices(v, p):
    """Slices that overlap and leave gaps: gradients must zero-fill and add, not concat."""
    g = cavs.tanh(cavs.concat(v.gather(0), v.gather(1)) @ p.W + p.b)    # width 4
    left, right = v.gather(0)[0:3], v.gather(1)[1:4]
    h = cavs.concat(g[0:2] * g[1:3], g[3:4] + left[2:3], v.pull()[0:1]) \
        + cavs.concat(right * v.pull()[1:4], g[0:1])
    v.scatter(h)
    v.push(h)


@pytest.mark.parametrize("cell", [cell_relu_sub, cell_mul_neg_sigmoid, cell_overlapping_slices])
@pytest.mark.parametrize("policy", ["batched", "serial"])
def test_op_gradient_rules(cell, policy):
    model = Model(cell, {"W": (8, 4), "b": (4,)}, arity=2, state=4, embedding=(10, 4), classes=5,
                  seed=5, dtype="float64")
    engine = cavs.Engine(model, backend=backend_name(), policy=policy)
    finite_difference_check(engine, dag_batch(model), np.random.default_rng(1), per_param=8)


def test_tree_lstm_on_dag_inputs():
    model = cavs.models.build("tree_lstm", hidden=3, seed=1, dtype="float64")
    engine = cavs.Engine(model, backend=backend_name())
    finite_difference_check(engine, dag_batch(model), np.random.default_rng(2), per_param=8)


def test_child_sum_gradients_pass_finite_differences(engines):
    model, engine = engines(32)
    batch = model.make_batch(nary_trees(seed=5)[:2] + [dag()])
    finite_differences(engine, batch, np.random.default_rng(0))


def test_missing_gradient_rule_is_named(monkeypatch):
    from cavs import grad
    monkeypatch.delitem(grad.GRADIENT_RULES, "tanh")
    with pytest.raises(cavs.TraceError, match=r"\(tanh\): no gradient rule for op 'tanh'"):
        cavs.models.build("tree_fc", hidden=4, leaves=4)
