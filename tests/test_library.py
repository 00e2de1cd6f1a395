"""Cavs as a library (issue 11), through the public API only: a child-sum Tree-LSTM written by a
user (cavs/models/child_sum.py) against a per-graph PyTorch float64 reference on n-ary
trees (arity up to 32) and a DAG; every batching policy; finite differences; one optimizer step
against torch.optim; the errors a user sees for bad graphs and bad vertex functions; save/load;
a model that reads float features (inputs=D); the same model in DyNet (baselines/dynet_child_sum.py)."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cavs
from cavs import concat, tanh
from cavs.models import child_sum

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
H, E, V, C = 4, 3, 10, 5          # hidden, embedding width, vocabulary, classes (float64 checks)


# ---------------------------------------------------------------- input graphs

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


def max_degree(graphs):
    return max(int((g.children >= 0).sum(axis=1).max()) for g in graphs)


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


def reference_forward(graphs, P, reduction="mean"):
    """Child-sum Tree-LSTM (Tai et al. 2015) per graph, vertex by vertex, in PyTorch: the loss
    over the labelled vertices and the softmax per vertex (rows in the graph's vertex order)."""
    hidden = P["Uf"].shape[0]
    total, count, probs = 0.0, 0, []
    for g in graphs:
        kids = [[int(c) for c in row if c >= 0] for row in g.children]
        hs, cs = {}, {}
        for v in topological(kids):
            tok = int(g.tokens[v])
            x = P["emb"][tok] if tok >= 0 else torch.zeros(P["W"].shape[0], dtype=torch.float64)
            h_sum = sum((hs[k] for k in kids[v]), torch.zeros(hidden, dtype=torch.float64))
            i, o, u = (x @ P["W"] + h_sum @ P["U"] + P["b"]).split(hidden)
            fx = x @ P["Wf"] + P["bf"]
            c = torch.sigmoid(i) * torch.tanh(u)
            for k in kids[v]:
                c = c + torch.sigmoid(fx + hs[k] @ P["Uf"]) * cs[k]
            hs[v], cs[v] = torch.sigmoid(o) * torch.tanh(c), c
        logits = torch.stack([hs[v] for v in range(g.num_vertices)]) @ P["Wout"] + P["bout"]
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


@pytest.fixture(scope="module")
def engines():
    """Engines are built once per (arity, policy, fusion): building one with 32 child slots takes
    seconds. Every test sets the weights it needs."""
    cache = {}

    def get(arity, policy="batched", fusion=False, **model_options):
        key = (arity, policy, fusion, tuple(sorted(model_options.items())))
        if key not in cache:
            model = child_sum_model(arity, **model_options)
            cache[key] = (model, cavs.Engine(model, backend="numpy", policy=policy, fusion=fusion))
        model, engine = cache[key]
        for name, value in model.init_params().items():    # fresh weights, same seed
            engine.params[name] = value
        return model, engine
    return get


GRAPH_SETS = {"nary": nary_trees, "sst_nary": sst_trees, "dag": lambda: [dag()]}


# ---------------------------------------------------------------- against PyTorch

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


def test_fused_kernels_equal_pytorch_at_small_arity(engines):
    """The default engine (fusion on, Numba kernels) at arity 4 on trees of degree <= 4."""
    rng = np.random.default_rng(7)
    graphs = [random_tree(rng, n, f"tree {i}", max_degree=4) for i, n in enumerate((15, 9, 4, 1))]
    graphs.append(random_tree(rng, 5, "fan", wide=4))
    model, engine = engines(4, fusion=True)
    loss, grads = engine.loss_and_grads(model.make_batch(graphs))
    ref_loss, ref_grads, _ = reference(graphs, dict(engine.params))
    assert loss == pytest.approx(ref_loss, rel=1e-9)
    for name in grads:
        assert_close(grads[name], ref_grads[name], 1e-7, f"fused: d loss/d {name}")


@pytest.mark.parametrize("policy", [p for p in cavs.scheduler.POLICIES if p != "serial"])
def test_every_policy_equals_serial(policy, engines):
    graphs = nary_trees(seed=3) + [dag()] + sst_trees(3)
    results = {}
    for p in ("serial", policy):
        model, engine = engines(32, p)
        results[p] = engine.loss_and_grads(model.make_batch(graphs))
        results[p] = (*results[p], engine.predict(model.make_batch(graphs)))
    (l1, g1, p1), (l2, g2, p2) = results["serial"], results[policy]
    assert l2 == pytest.approx(l1, rel=1e-12)
    for name in g1:
        assert_close(g2[name], g1[name], 1e-10, f"{policy} vs serial: d loss/d {name}")
    for a, b in zip(p1, p2):
        assert_close(b, a, 1e-12, f"{policy} vs serial: predict")


# ---------------------------------------------------------------- finite differences

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


def test_child_sum_gradients_pass_finite_differences(engines):
    model, engine = engines(32)
    batch = model.make_batch(nary_trees(seed=5)[:2] + [dag()])
    finite_differences(engine, batch, np.random.default_rng(0))


# ---------------------------------------------------------------- optimizers against torch.optim

def all_rows_batch(seed=11):
    """Trees whose tokens use every row of the vocabulary (so a dense torch optimizer and the
    engine's sparse embedding update must agree everywhere)."""
    rng = np.random.default_rng(seed)
    graphs = [random_tree(rng, 14, "tree x", max_degree=5), random_tree(rng, 9, "tree y", wide=6), dag()]
    used = {int(t) for g in graphs for t in g.tokens if t >= 0}
    extra = sorted(set(range(V)) - used)
    graphs.append(cavs.Graph.from_children([[] for _ in extra] + [list(range(len(extra)))],
                                           tokens=extra + [-1], labels=[-1] * len(extra) + [3],
                                           name="rest of the vocabulary"))
    return graphs


OPTIMIZERS = {
    "sgd": (lambda **kw: cavs.optim.SGD(lr=0.5, **kw), lambda ps, **kw: torch.optim.SGD(ps, lr=0.5, **kw)),
    "adagrad": (lambda **kw: cavs.optim.Adagrad(lr=0.05, **kw),
                lambda ps, **kw: torch.optim.Adagrad(ps, lr=0.05, **kw)),
    "adam": (lambda **kw: cavs.optim.Adam(lr=0.01, **kw), lambda ps, **kw: torch.optim.Adam(ps, lr=0.01, **kw)),
}


@pytest.mark.parametrize("setting", ["plain", "weight_decay", "clip", "both"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_optimizer_steps_equal_torch_optim(opt, setting):
    wd = 1e-2 if setting in ("weight_decay", "both") else 0.0
    clip = 0.05 if setting in ("clip", "both") else None       # small: the clipping really applies
    graphs = all_rows_batch()
    model = child_sum_model(8)
    ours, theirs = OPTIMIZERS[opt]
    engine = cavs.Engine(model, backend="numpy", fusion=False, optimizer=ours(weight_decay=wd, clip_norm=clip))
    batch = model.make_batch(graphs)
    P = torch_params(dict(engine.params))
    torch_opt = theirs(list(P.values()), weight_decay=wd)
    for step in range(3):
        loss = engine.step(batch)
        torch_opt.zero_grad()
        ref_loss, _ = reference_forward(graphs, P)
        ref_loss.backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(list(P.values()), clip)
            assert float(norm) > clip
        torch_opt.step()
        assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-9), f"step {step}"
        for name, p in P.items():
            assert_close(engine.params[name], p.detach().numpy(), 1e-9, f"{opt} {setting} step {step}: {name}")


def test_unused_embedding_rows_are_left_alone():
    """Rows no vertex reads: no weight decay, no optimizer state change (Adam's moments too)."""
    model = child_sum_model(8)
    engine = cavs.Engine(model, backend="numpy", fusion=False,
                         optimizer=cavs.optim.Adam(lr=0.01, weight_decay=0.1))
    graphs = [cavs.Graph.from_children([[], [], [0, 1]], tokens=[1, 2, -1], labels=[0, 1, 2], name="t")]
    before = engine.params["emb"].copy()     # (on the CPU backend the view is the live array)
    engine.step(model.make_batch(graphs))
    after = engine.params["emb"].copy()
    unused = [r for r in range(V) if r not in (1, 2)]
    np.testing.assert_array_equal(after[unused], before[unused])
    assert (after[[1, 2]] != before[[1, 2]]).all()
    engine.step(model.make_batch([cavs.Graph.from_children([[]], tokens=[5], labels=[0], name="u")]))
    np.testing.assert_array_equal(engine.params["emb"][[1, 2]], after[[1, 2]])


# ---------------------------------------------------------------- errors a user sees

def test_bad_graphs_raise_input_error_naming_graph_and_vertex():
    model = child_sum.model(2, H, E, V, classes=C)
    cases = [
        (lambda: model.make_batch([cavs.Graph.from_children([[], [], [], [0, 1, 2]], name="too wide")]),
         r"too wide: vertex 3 has 3 children, more than .*arity 2"),
        (lambda: model.make_batch([cavs.Graph.from_children([[], [2], [1]], name="loop")]),
         r"loop: .*cycle.* vertex [12]\b"),
        (lambda: cavs.Graph.from_children([[], [0, 5]], name="dangling"),
         r"dangling: vertex 1 child 1 is 5, out of range"),
        (lambda: model.make_batch([cavs.Graph.from_children([[], [0]], labels=[-1, C], name="big label")]),
         rf"big label: vertex 1 has label {C}, outside 0..{C - 1}"),
        (lambda: model.make_batch([cavs.Graph.from_children([[], [0]], tokens=[V, -1], name="big token")]),
         rf"big token: vertex 0 has token {V}, outside the vocabulary 0..{V - 1}"),
        (lambda: cavs.Graph.from_parents([1, -1, 7], name="parents"), r"parents: vertex 2"),
    ]
    for make, pattern in cases:
        with pytest.raises(cavs.InputError, match=pattern):
            make()
    # the second graph of a batch is named, with its own vertex numbers
    good = cavs.Graph.from_children([[], [0]], tokens=[1, 2], labels=[0, 1], name="fine")
    with pytest.raises(cavs.InputError, match=r"second: vertex 0 has token 10"):
        model.make_batch([good, cavs.Graph.from_children([[]], tokens=[V], name="second")])


def test_fractional_tokens_and_labels_raise_input_error():
    with pytest.raises(cavs.InputError, match=r"fractional: vertex 0"):
        cavs.Graph.from_children([[]], tokens=[1.7], labels=[2.9], name="fractional")


def test_features_given_to_a_model_without_inputs_raise_input_error():
    model = cavs.Model(feature_cell, {"W": (3, 4), "U": (4, 4), "b": (4,)}, arity=2, state=4,
                       embedding=(V, 3), classes=2)
    g = cavs.Graph.from_children([[], [0]], tokens=[1, 2], features=np.zeros((2, 3)), labels=[0, 1], name="extra")
    with pytest.raises(cavs.InputError, match=r"extra: the graph has features, but the model reads none"):
        model.make_batch([g])


def feature_cell(v, p):
    x = v.pull()
    h = tanh(x @ p.W + sum(v.gather_all()) @ p.U + p.b)
    v.scatter(h)
    v.push(h)


def test_features_of_the_wrong_width_raise_input_error():
    model = cavs.Model(feature_cell, {"W": (3, 4), "U": (4, 4), "b": (4,)}, arity=2, state=4, inputs=3, classes=2)
    g = cavs.Graph.from_children([[], [0]], features=np.zeros((2, 4)), labels=[0, 1], name="wide features")
    with pytest.raises(cavs.InputError, match=r"wide features: .*3 features per vertex.*\(2, 4\)"):
        model.make_batch([g])
    with pytest.raises(cavs.InputError, match="no features"):
        model.make_batch([cavs.Graph.from_children([[], [0]], labels=[0, 1], name="no features")])


def line_of(fn, text: str) -> str:
    """'test_library.py:LINE' of the line of fn's source that contains `text`."""
    lines, first = inspect.getsourcelines(fn)
    return f"{Path(__file__).name}:{first + next(i for i, l in enumerate(lines) if text in l)}"


def cell_unknown_param(v, p):
    h = tanh(v.pull() @ p.W + v.gather(0) @ p.Missing)
    v.scatter(h)
    v.push(h)


def cell_gather_beyond(v, p):
    h = tanh(v.pull() @ p.W + v.gather(2) @ p.U)
    v.scatter(h)
    v.push(h)


def cell_wrong_width(v, p):
    h = tanh(v.pull() @ p.W + v.gather(0) @ p.U)
    v.scatter(concat(h, h))
    v.push(h)


def cell_no_scatter(v, p):
    h = tanh(v.pull() @ p.W + v.gather(0) @ p.U)
    v.push(h)


def build(cell):
    return cavs.Model(cell, {"W": (3, 4), "U": (4, 4)}, arity=2, state=4, embedding=(V, 3), classes=2)


@pytest.mark.parametrize("cell, text, message", [
    (cell_unknown_param, "p.Missing", r"unknown parameter p\.Missing"),
    (cell_gather_beyond, "gather(2)", r"gather.*child index 2 is beyond the declared arity 2"),
    (cell_wrong_width, "v.scatter", r"scatter.*width 8.*state width 4"),
])
def test_bad_vertex_functions_raise_trace_error_naming_the_line(cell, text, message):
    with pytest.raises(cavs.TraceError, match=message) as info:
        build(cell)
    assert line_of(cell, text) in str(info.value)


def test_vertex_function_that_never_scatters_names_its_line():
    with pytest.raises(cavs.TraceError, match="scatter was never called") as info:
        build(cell_no_scatter)
    assert line_of(cell_no_scatter, "def cell_no_scatter") in str(info.value)


def test_vertex_function_that_never_scatters_raises_trace_error():
    with pytest.raises(cavs.TraceError, match=r"\(cell_no_scatter\): scatter was never called"):
        build(cell_no_scatter)


def cell_slices_a_parameter(v, p):
    h = tanh(v.pull() @ p.W[:, :2] + v.gather(0) @ p.U)
    v.scatter(h)
    v.push(h)


def test_indexing_a_parameter_raises_trace_error_naming_the_line():
    with pytest.raises(cavs.TraceError) as info:
        build(cell_slices_a_parameter)
    assert line_of(cell_slices_a_parameter, "p.W[:, :2]") in str(info.value)


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


# ---------------------------------------------------------------- the same model in DyNet

def test_dynet_child_sum_gives_the_same_losses_as_cavs():
    """baselines/dynet_child_sum.py's DyNet model (child loop over the actual children) against
    Cavs on the same n-ary SST batch from the same weights, three SGD steps (float32)."""
    pytest.importorskip("dynet")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "experiments.studies", "nary", "--check", "--trees", "8",
                           "--hidden", "16", "--embed", "8", "--batch-size", "8"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["max_degree"] >= 5
    for step, (a, b) in enumerate(zip(result["cavs"], result["dynet"])):
        assert b == pytest.approx(a, rel=2e-5), f"step {step}: cavs {a}, dynet {b}"
