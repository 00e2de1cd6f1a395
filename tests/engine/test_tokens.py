"""Token sharing (cavs/tokens.py): the products of a word's embedding computed once per distinct word
of a batch give the numbers of the plain products (float64: loss and every gradient, the embedding's
included), whole-batch and per task, with words on leaves only (one dense range), on inner vertices
too (rows without a word inside a range) and with two products of the pull whose input gradients
add up; a vertex function that uses its pull otherwise is not shared and still right. (The gradient
tests against PyTorch run the default engine, which shares.)"""
from __future__ import annotations

import numpy as np
import pytest

import cavs
from cavs import tanh
from cavs.models import child_sum
from experiments import floors
from tests.conftest import backend_name
from tests.engine.helpers import C, E, H, V, engine_for, nary_trees

pytestmark = pytest.mark.skipif(backend_name() != "numpy", reason="tokens are shared on the CPU backend")

SAMPLES = {"tree_lstm": ["(1 (2 a) (3 (2 b) (2 a)))", "(0 (2 a) (2 b))", "(4 (1 c) (2 a))"],
           "var_lstm": [[1, 2, 3, 1, 2], [2, 2, 5], [1, 3]],
           "fixed_lstm": [[1, 2, 3, 1], [2, 2, 5, 1], [1, 3, 3, 3]]}


def both(model, batch, **options):
    """(loss, grads, engine) with tokens shared and without."""
    out = {}
    for share in (True, False):
        engine = cavs.Engine(model, backend=backend_name(), share_tokens=share, **options)
        loss, grads = engine.loss_and_grads(batch)
        out[share] = (loss, grads, engine)
    return out


def assert_same(out):
    (l1, g1, _), (l2, g2, _) = out[True], out[False]
    assert l1 == pytest.approx(l2, rel=1e-12)
    assert set(g1) == set(g2)
    for k in g1:
        np.testing.assert_allclose(g1[k], g2[k], rtol=1e-10, atol=1e-13, err_msg=f"d{k}")


@pytest.mark.parametrize("workload", sorted(SAMPLES))
@pytest.mark.parametrize("options", [{}, {"lazy": False, "eager": False}], ids=["batched", "per task"])
def test_shared_products_give_the_plain_numbers(workload, options):
    model, _ = engine_for(workload)
    out = both(model, model.make_batch(SAMPLES[workload]), **options)
    assert out[True][2]._low.shared is not None and out[True][2]._low.batch.tokens is not None
    assert out[False][2]._low.shared is None
    assert_same(out)
    assert np.abs(out[True][1]["emb"]).max() > 0


def test_words_inside_the_trees_and_two_products_of_the_pull():
    """The child-sum model multiplies x by W and by Wf (at vertices with a word and children):
    rows without a word inside a range, and the embedding's gradient as the sum of two shared
    input gradients."""
    model = child_sum.model(None, hidden=H, embed=E, vocab=V, classes=C, dtype="float64", seed=2)
    out = both(model, model.make_batch(nary_trees()))
    shared = out[True][2]._low.shared
    assert shared is not None and len(shared.products) == 2 and len(shared.elided) == 1
    assert_same(out)


def test_a_pull_used_elementwise_is_not_shared():
    def cell(v, p):
        x = v.pull()
        h = tanh(x @ p.W + x * p.s + v.gather(0) @ p.U)
        v.scatter(h)
        v.push(h)
    model = cavs.Model(cell, {"W": (3, 3), "s": (3,), "U": (3, 3)}, arity=1, state=3, embedding=(6, 3),
                       classes=2, dtype="float64", seed=1)
    graphs = [cavs.Graph.from_children([[], [0], [1]], tokens=[1, 2, 1], labels=[0, 1, 1])]
    out = both(model, model.make_batch(graphs))
    assert out[True][2]._low.shared is None
    assert_same(out)


def test_predict_shares_too():
    model, _ = engine_for("tree_lstm")
    batch = model.make_batch(SAMPLES["tree_lstm"])
    got = [cavs.Engine(model, backend=backend_name(), share_tokens=s).predict(batch) for s in (True, False)]
    for a, b in zip(*got):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_the_floor_counts_each_batchs_distinct_words():
    graphs = [cavs.Graph.from_children([[], [], [0, 1]], tokens=[4, 4, -1]),
              cavs.Graph.from_children([[], [], [0, 1]], tokens=[4, 7, -1]),
              cavs.Graph.from_children([[], [0]], tokens=[7, 7])]
    assert floors.distinct_words(graphs, 2) == 2 + 1      # {4, 7}, then {7}
    assert floors.distinct_words(graphs, 3) == 2
    assert floors.distinct_words(graphs, 3, lambda g: g.children.max(axis=1) >= 0) == 1   # only 7 has children
