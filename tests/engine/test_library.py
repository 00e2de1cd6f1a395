"""Cavs as a library, through the public API only, as a user meets it: a child-sum Tree-LSTM written
by a user (cavs/models/child_sum.py) against a per-graph PyTorch float64 reference on n-ary trees
(arity up to 32), n-ary SST trees and a DAG (loss, gradients, predict); save/load; a model that reads
float features (inputs=D). The same model's trace errors, input errors, policies, gradients and
optimizers are checked by stage: test_trace.py, test_graphs.py, test_scheduler.py, test_grad.py,
test_optim.py (and test_fusion.py, its fused kernels); its DyNet twin in tests/systems."""
from __future__ import annotations

import numpy as np
import pytest

import cavs
from cavs.models import child_sum
from tests.engine.helpers import C, V, assert_close, dag, feature_cell, finite_differences, nary_trees, \
    random_tree, reference, sst_trees

torch = pytest.importorskip("torch")


def max_degree(graphs):
    return max(int((g.children >= 0).sum(axis=1).max()) for g in graphs)


GRAPH_SETS = {"nary": nary_trees, "sst_nary": sst_trees, "dag": lambda: [dag()]}


@pytest.mark.parametrize("which", list(GRAPH_SETS))
def test_loss_gradients_and_predict_equal_pytorch(which, engines):
    graphs = GRAPH_SETS[which]()
    if which == "nary":
        assert max_degree(graphs) == 32
    model, engine = engines(32)
    batch = model.make_batch(graphs)
    loss, grads = engine.loss_and_grads(batch)
    ref_loss, ref_grads, ref_probs = reference(graphs, dict(engine.params))
    assert loss == pytest.approx(ref_loss, rel=1e-9)
    assert set(grads) == set(ref_grads)
    for name in grads:
        assert_close(grads[name], ref_grads[name], 1e-7, f"{which}: d loss/d {name}")
    probs = engine.predict(batch)
    assert [p.shape for p in probs] == [(g.num_vertices, C) for g in graphs]
    for g, got, want in zip(graphs, probs, ref_probs):
        assert_close(got, want, 1e-9, f"{g.name}: predict")


# ---------------------------------------------------------------- save / load

@pytest.mark.parametrize("optimizer", [None, "adagrad", "adam"])
def test_reloaded_engine_continues_with_the_same_losses(optimizer, tmp_path):
    make = {None: lambda: None, "adagrad": lambda: cavs.optim.Adagrad(lr=0.05, weight_decay=1e-4),
            "adam": lambda: cavs.optim.Adam(lr=0.01, weight_decay=1e-4, clip_norm=1.0)}[optimizer]
    model = child_sum.model(6, 8, 5, V, classes=C, seed=2)         # float32, as a user trains
    rng = np.random.default_rng(4)
    batches = [model.make_batch([random_tree(rng, int(n), f"t{i}{j}", max_degree=6)
                                 for j, n in enumerate(rng.integers(1, 12, size=3))]) for i in range(3)]
    straight = cavs.Engine(model, backend="numpy", fusion=False, optimizer=make())
    want = [straight.step(b) for b in batches + batches]
    first = cavs.Engine(model, backend="numpy", fusion=False, optimizer=make())
    got = [first.step(b) for b in batches]
    first.save(tmp_path / "model.npz")
    second = cavs.Engine.load(tmp_path / "model.npz", model, backend="numpy", fusion=False)
    assert type(second.optimizer) is type(straight.optimizer)
    got += [second.step(b) for b in batches]
    assert got == want
    for name, value in straight.params.items():
        np.testing.assert_array_equal(second.params[name], value)


# ---------------------------------------------------------------- a model on float features

def feature_graphs(rng, count, D):
    graphs = []
    for i in range(count):
        n = int(rng.integers(2, 9))
        kids = [[] for _ in range(n)]
        for v in range(1, n):
            kids[v] = sorted(rng.choice(v, size=min(v, int(rng.integers(0, 3))), replace=False).tolist())
        x = rng.normal(size=(n, D))
        labels = (x[:, 0] > 0).astype(int)                    # learnable from the vertex's own input
        graphs.append(cavs.Graph.from_children(kids, features=x, labels=labels, name=f"dag {i}"))
    return graphs


def test_feature_model_trains_and_passes_finite_differences():
    D = 3
    rng = np.random.default_rng(0)
    graphs = feature_graphs(rng, 6, D)
    model64 = cavs.Model(feature_cell, {"W": (D, 4), "U": (4, 4), "b": (4,)}, arity=2, state=4,
                         inputs=D, classes=2, seed=3, dtype="float64")
    engine = cavs.Engine(model64, backend="numpy", fusion=False)
    finite_differences(engine, model64.make_batch(graphs), np.random.default_rng(1))
    model = cavs.Model(feature_cell, {"W": (D, 4), "U": (4, 4), "b": (4,)}, arity=2, state=4,
                       inputs=D, classes=2, seed=3)
    trainer = cavs.Engine(model, backend="numpy", fusion=False, optimizer=cavs.optim.Adam(lr=0.05))
    batch = model.make_batch(graphs)
    losses = [trainer.step(batch) for _ in range(30)]
    assert np.isfinite(losses).all() and losses[-1] < 0.7 * losses[0]
