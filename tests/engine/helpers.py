"""What several files of tests/engine share: the four workloads' engines and a tiny Tree-LSTM batch,
and the child-sum Tree-LSTM a user writes (cavs/models/child_sum.py) with its input graphs (random
n-ary trees, a DAG, n-ary SST trees) and its per-graph PyTorch float64 reference."""
from __future__ import annotations

import numpy as np
import pytest

import cavs
from cavs import Batch, tanh
from cavs.graphs import Graph, make_forest
from cavs.models import child_sum
from tests.conftest import backend_name

try:
    import torch
except ImportError:               # the files that use the reference skip without torch
    torch = None

H, E, V, C = 4, 3, 10, 5          # hidden, embedding width, vocabulary, classes (float64 checks)
TREE = "(1 (2 a) (3 (2 b) (2 c)))"     # 3 tasks: the 3 leaves, the inner vertex, the root


# ---------------------------------------------------------------- the four workloads

def engine_for(workload, policy="batched", hidden=5, reduction="mean", **options):
    model = cavs.models.build(workload, hidden=hidden, seed=3, dtype="float64", leaves=8, reduction=reduction)
    return model, cavs.Engine(model, backend=backend_name(), policy=policy, **options)


def run(workload, samples, **options):
    model = cavs.models.build(workload, hidden=6, seed=4, dtype="float64", leaves=8)
    engine = cavs.Engine(model, backend=backend_name(), **options)
    return engine.loss_and_grads(model.make_batch(samples)), engine


def dag_batch(model):
    """A DAG whose vertex 2 has two parents, one of them two levels up, and a vertex that
    gathers the same child twice; and a tree."""
    children = np.array([[-1, -1], [-1, -1], [0, 1], [2, 1], [2, 3], [4, 4]])
    tokens = np.array([3, 7, -1, 5, -1, -1])
    labels = np.array([1, -1, 0, 2, -1, 4])
    g = Graph(children, tokens, labels, "dag")
    return Batch(make_forest([g, Graph(children[:3], tokens[:3], labels[:3], "tree")], 2))


# ---------------------------------------------------------------- the child-sum model's input graphs

def relabel(children: list[list[int]], tokens, labels, rng, name):
    """The same graph with its vertices numbered in a random order (vertices come in any order)."""
    n = len(children)
    perm = rng.permutation(n)                    # old vertex v becomes perm[v]
    new_children, new_tokens, new_labels = [None] * n, [0] * n, [0] * n
    for v in range(n):
        new_children[perm[v]] = [int(perm[c]) for c in children[v]]
        new_tokens[perm[v]], new_labels[perm[v]] = tokens[v], labels[v]
    return cavs.Graph.from_children(new_children, tokens=new_tokens, labels=new_labels, name=name)


def random_tree(rng, n: int, name: str, wide: int = 0, max_degree: int | None = None):
    """A random n-ary tree of n vertices (root 0); with `wide`, vertex 0 has exactly `wide`
    children; others attach to a random earlier vertex (mixed degrees). Every vertex gets a
    token with probability 0.7 (internal ones too) and a label with probability 0.6."""
    children = [[] for _ in range(n)]
    for v in range(1, n):
        if v <= wide:
            parent = 0
        else:
            while True:
                parent = int(rng.integers(1 if wide else 0, v))
                if max_degree is None or len(children[parent]) < max_degree:
                    break
        children[parent].append(v)
    tokens = [int(rng.integers(V)) if rng.random() < 0.7 else -1 for _ in range(n)]
    labels = [int(rng.integers(C)) if rng.random() < 0.6 else -1 for _ in range(n)]
    labels[0] = int(rng.integers(C))
    return relabel(children, tokens, labels, rng, name)


def nary_trees(seed=0):
    rng = np.random.default_rng(seed)
    return [random_tree(rng, 40, "wide tree", wide=32), random_tree(rng, 12, "tree a"),
            random_tree(rng, 7, "tree b"), random_tree(rng, 1, "single vertex")]


def dag():
    """Vertex 1 is a child of both 2 and 3; vertex 4 reads 2 and 3 (a diamond over vertex 1)."""
    return cavs.Graph.from_children([[], [], [0, 1], [1], [3, 2]], tokens=[4, 9, -1, 2, -1],
                                    labels=[1, -1, 2, -1, 0], name="dag")


def sst_trees(limit=6):
    """Small n-ary SST trees, tokens folded into the test vocabulary (the structure is SST's)."""
    out = []
    for g in cavs.datasets.sst_nary_trees("train", limit=60):
        if g.num_vertices <= 40:
            kids = [[int(c) for c in row if c >= 0] for row in g.children]
            tokens = np.where(g.tokens >= 0, g.tokens % V, -1)
            out.append(cavs.Graph.from_children(kids, tokens=tokens, labels=g.labels, name=g.name))
    return out[:limit]


# ---------------------------------------------------------------- the PyTorch reference

def topological(children):
    order, seen = [], set()

    def visit(v):
        if v in seen:
            return
        seen.add(v)
        for c in children[v]:
            visit(c)
        order.append(v)
    for v in range(len(children)):
        visit(v)
    return order


def child_sum_states(graph, P, rows):
    """Child-sum Tree-LSTM (Tai et al. 2015) over one graph, vertex by vertex, in PyTorch: every
    vertex's h, rows in the graph's vertex order; `rows(graph, v)` is vertex v's input."""
    hidden = P["Uf"].shape[0]
    kids = [[int(c) for c in row if c >= 0] for row in graph.children]
    hs, cs = {}, {}
    for v in topological(kids):
        x = rows(graph, v)
        h_sum = sum((hs[k] for k in kids[v]), torch.zeros(hidden, dtype=torch.float64))
        i, o, u = (x @ P["W"] + h_sum @ P["U"] + P["b"]).split(hidden)
        fx = x @ P["Wf"] + P["bf"]
        c = torch.sigmoid(i) * torch.tanh(u)
        for k in kids[v]:
            c = c + torch.sigmoid(fx + hs[k] @ P["Uf"]) * cs[k]
        hs[v], cs[v] = torch.sigmoid(o) * torch.tanh(c), c
    return torch.stack([hs[v] for v in range(graph.num_vertices)])


def embedded(P):
    """rows(graph, v) for child_sum_states: the embedding's row of v's token, zeros without one."""
    zero = torch.zeros(P["W"].shape[0], dtype=torch.float64)
    return lambda g, v: P["emb"][int(g.tokens[v])] if g.tokens[v] >= 0 else zero


def reference_forward(graphs, P, reduction="mean"):
    """The child-sum Tree-LSTM per graph in PyTorch, with its softmax head: the loss over the
    labelled vertices and the softmax per vertex (rows in the graph's vertex order)."""
    total, count, probs = 0.0, 0, []
    for g in graphs:
        logits = child_sum_states(g, P, embedded(P)) @ P["Wout"] + P["bout"]
        probs.append(torch.softmax(logits, dim=1).detach().numpy())
        labels = torch.as_tensor(np.asarray(g.labels))
        keep = labels >= 0
        total = total + torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum")
        count += int(keep.sum())
    loss = total / count if reduction == "mean" else total
    return loss, probs


def torch_params(params: dict):
    return {k: torch.tensor(np.asarray(v, dtype=np.float64), requires_grad=True) for k, v in params.items()}


def reference(graphs, params):
    P = torch_params(params)
    loss, probs = reference_forward(graphs, P)
    loss.backward()
    return float(loss.detach()), {k: p.grad.numpy() for k, p in P.items()}, probs


def assert_close(got, want, rel, what):
    scale = max(1e-12, float(np.abs(want).max()))
    err = float(np.abs(np.asarray(got) - np.asarray(want)).max()) / scale
    assert err <= rel, f"{what}: relative error {err:.2e} > {rel}"


def child_sum_model(arity, **options):
    return child_sum.model(arity, H, E, V, classes=C, seed=1, dtype="float64", **options)


def finite_differences(engine, batch, rng, per_param=3, eps=1e-6, rtol=1e-6):
    """Central differences on a few entries of every parameter (the embedding: rows used)."""
    loss, grads = engine.loss_and_grads(batch)
    assert set(grads) == set(engine.params)
    for name, g in grads.items():
        p = engine.params[name]
        flat = np.flatnonzero(np.abs(g) > 0) if name == "emb" else np.arange(p.size)
        for i in rng.choice(flat, size=min(per_param, len(flat)), replace=False):
            idx = np.unravel_index(i, p.shape)
            values = []
            for delta in (eps, -eps, 0.0):
                q = p.copy()
                q[idx] += delta
                engine.params[name] = q
                if delta:
                    values.append(engine.infer(batch))
            numeric = (values[0] - values[1]) / (2 * eps)
            assert g[idx] == pytest.approx(numeric, rel=rtol, abs=1e-8 * max(1.0, abs(loss))), \
                f"d loss/d {name}{idx}: engine {g[idx]}, finite difference {numeric}"


def feature_cell(v, p):
    x = v.pull()
    h = tanh(x @ p.W + sum(v.gather_all()) @ p.U + p.b)
    v.scatter(h)
    v.push(h)
