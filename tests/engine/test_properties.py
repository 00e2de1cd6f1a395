"""Property-based checks (hypothesis) on random input graphs: any forest of random trees and
DAGs gives the same numbers batched and serial, and a batch's loss is the sum of its samples'."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cavs
from cavs.graphs import Graph, make_forest
from cavs import Batch


@st.composite
def random_dag(draw, max_vertices=9):
    """Vertex v's children are earlier vertices (so it is acyclic); some share children."""
    n = draw(st.integers(1, max_vertices))
    children = np.full((n, 2), -1, dtype=np.int64)
    for v in range(1, n):
        for k in range(2):
            if draw(st.booleans()):
                children[v, k] = draw(st.integers(0, v - 1))
    tokens = np.array([draw(st.integers(-1, 20)) for _ in range(n)], dtype=np.int64)
    labels = np.array([draw(st.integers(-1, 4)) for _ in range(n)], dtype=np.int64)
    labels[-1] = draw(st.integers(0, 4))            # at least one loss term
    return Graph(children, tokens, labels, "random")


MODEL = cavs.models.build("tree_lstm", hidden=3, seed=7, dtype="float64", reduction="sum")  # summed loss: per-sample terms add up


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(random_dag(), min_size=1, max_size=4))
def test_batched_equals_serial_and_per_sample_sum(graphs):
    batch = Batch(make_forest(graphs, 2))
    batched = cavs.Engine(MODEL, backend="numpy", policy="batched").loss_and_grads(batch)
    serial = cavs.Engine(MODEL, backend="numpy", policy="serial").loss_and_grads(batch)
    alone = [cavs.Engine(MODEL, backend="numpy").loss_and_grads(Batch(make_forest([g], 2))) for g in graphs]
    assert batched[0] == pytest.approx(serial[0], rel=1e-12)
    assert batched[0] == pytest.approx(sum(a[0] for a in alone), rel=1e-12)
    for name, g in batched[1].items():
        scale = max(1e-12, np.abs(g).max())
        assert np.abs(serial[1][name] - g).max() <= 1e-10 * scale, name
        assert np.abs(sum(a[1][name] for a in alone) - g).max() <= 1e-10 * scale, name
