"""Children as edges, and the op vocabulary, through the public API: the child-sum Tree-LSTM on
`v.children()` over n-ary trees with degrees 0 to 300 and over a DAG, attention over children,
and a model using every op, each against a per-graph PyTorch float64 autograd reference (loss to
1e-9, every gradient to 1e-7, predict); batched equals serial, finite differences, the slot form
equals the edge form, the kernels do not grow with the degree, and the errors a user meets."""
from __future__ import annotations

import numpy as np
import pytest

import cavs
from cavs import concat, sigmoid, tanh
from cavs.models import child_sum
from tests.engine.helpers import (C, E, H, V, assert_close, dag, finite_differences, random_tree, reference,
                                  topological, torch_params)

torch = pytest.importorskip("torch")


def wide_trees(seed=0):
    """Degrees from 0 to 300: a root with 300 children, mixed random trees, a single vertex."""
    rng = np.random.default_rng(seed)
    return [random_tree(rng, 301, "wide 300", wide=300), random_tree(rng, 30, "mixed a"),
            random_tree(rng, 9, "mixed b"), random_tree(rng, 1, "single vertex")]


def kids_of(g):
    return [[int(c) for c in row if c >= 0] for row in g.children]


def check(engine, model, graphs, ref_loss, ref_grads, ref_probs=None):
    batch = model.make_batch(graphs)
    loss, grads = engine.loss_and_grads(batch)
    assert loss == pytest.approx(ref_loss, rel=1e-9)
    assert set(grads) == set(ref_grads)
    for k in grads:
        assert_close(grads[k], ref_grads[k], 1e-7, f"d{k}")
    if ref_probs is not None:
        for got, want in zip(engine.predict(batch), ref_probs):
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    return loss, grads


# ---------------------------------------------------------------- the child-sum Tree-LSTM on edges

def edge_model(**options):
    return child_sum.model(None, H, E, V, classes=C, **{"seed": 1, "dtype": "float64", **options})


@pytest.mark.parametrize("graphs", ["wide", "dag"])
@pytest.mark.parametrize("fusion", [False, True])
def test_child_sum_on_edges_equals_pytorch(graphs, fusion):
    graphs = wide_trees() if graphs == "wide" else [dag(), *wide_trees(1)[1:]]
    model = edge_model()
    engine = cavs.Engine(model, fusion=fusion)
    loss, grads, probs = reference(graphs, dict(engine.params))
    check(engine, model, graphs, loss, grads, probs)


def test_fused_kernels_read_broadcasts_through_the_parent_index():
    """With fusion on the CPU, kids.broadcast(x) is never copied onto the edges: the per-edge
    kernels read x's parent row, the per-edge ops of one broadcast run as one kernel, and the
    numbers are those of the unfused engine (which copies) to rounding."""
    graphs = [dag(), *wide_trees(3)[1:]]
    model = edge_model()
    fused, plain = cavs.Engine(model), cavs.Engine(model, fusion=False)
    assert {n.op for n in fused._low.read_through} == {"broadcast"} and len(fused._low.read_through) == 3
    # the forget gates' kernel, its gradient's (dc * c_k and dc * f_k together), and dh_k's add alone
    assert sorted(len(g.nodes) for g in fused._low.fused_groups() if cavs.fusion.reads_broadcast(g)) == [1, 3, 3]
    fused.counters.reset()
    la, ga = fused.loss_and_grads(model.make_batch(graphs))
    assert "broadcast" not in fused.counters.kernels
    lb, gb = plain.loss_and_grads(model.make_batch(graphs))
    assert plain.counters.kernels["broadcast"] > 0
    assert la == pytest.approx(lb, rel=1e-12)
    for k in ga:
        assert_close(ga[k], gb[k], 1e-12, f"d{k}")


def test_a_child_listed_twice_is_two_edges():
    """Vertex 3 lists vertex 1 twice: two edges, each read, both gradients added into vertex 1."""
    twice = cavs.Graph.from_children([[], [], [0, 1], [1, 2, 1]], tokens=[4, 9, -1, 2],
                                     labels=[1, -1, 2, 0], name="child twice")
    model = edge_model()
    engine = cavs.Engine(model)
    loss, grads, probs = reference([twice, dag()], dict(engine.params))
    check(engine, model, [twice, dag()], loss, grads, probs)


def test_batched_equals_serial_and_every_policy():
    graphs = [dag(), *wide_trees(2)]
    model = edge_model()
    ref = cavs.Engine(model).loss_and_grads(model.make_batch(graphs))
    for policy in ("serial", "alap", "merged"):
        loss, grads = cavs.Engine(model, policy=policy).loss_and_grads(model.make_batch(graphs))
        assert loss == pytest.approx(ref[0], rel=1e-12)
        for k in grads:
            assert_close(grads[k], ref[1][k], 1e-12, f"{policy}: d{k}")


def test_slot_form_and_edge_form_give_the_same_numbers():
    graphs = wide_trees(3)[1:]                                    # degrees that fit a few slots
    arity = max(max(len(k) for k in kids_of(g)) for g in graphs)
    edges, slots = edge_model(), child_sum.model(arity, H, E, V, classes=C, seed=1, dtype="float64")
    for options in ({}, {"fusion": False}, {"lazy": False, "eager": False}):
        a, b = cavs.Engine(edges, **options), cavs.Engine(slots, **options)
        la, ga = a.loss_and_grads(edges.make_batch(graphs))
        lb, gb = b.loss_and_grads(slots.make_batch(graphs))
        assert la == pytest.approx(lb, rel=1e-12)
        for k in ga:
            assert_close(ga[k], gb[k], 1e-12, f"d{k}")


def test_the_kernels_do_not_grow_with_the_degree():
    """One F for any degree: a batch whose vertices have 300 children compiles no kernel that a
    batch of degree 4 did not (a slot model has a copy of the per-child work per slot)."""
    model = edge_model(dtype="float32")
    rng = np.random.default_rng(4)
    engine = cavs.Engine(model)
    engine.step(model.make_batch([random_tree(rng, 12, "narrow", max_degree=4) for _ in range(3)]))
    kernels = {cavs.fusion.numba_source(g) for g in [*engine._low.fused_groups(), *engine._low.subgroups.values()]}
    engine.step(model.make_batch([random_tree(rng, 301, "wide", wide=300)]))
    after = {cavs.fusion.numba_source(g) for g in [*engine._low.fused_groups(), *engine._low.subgroups.values()]}
    assert after == kernels and len(kernels) <= 8


def test_finite_differences_on_every_parameter_of_the_edge_models():
    graphs = [dag(), *wide_trees(5)[1:]]
    for model in (edge_model(), attention_model(), every_op_model(dropout=False)):
        finite_differences(cavs.Engine(model), model.make_batch(graphs), np.random.default_rng(0), rtol=1e-5)


# ---------------------------------------------------------------- attention over children

def attention_cell(v, p):
    x = v.pull()
    kids = v.children()
    h_k, c_k = kids.state.split(2)
    a_k = kids.softmax(h_k @ p.q)                 # width 1, broadcast over the state's width
    context = (a_k * h_k).sum()
    c = (a_k * c_k).sum() + sigmoid(x @ p.Wc)
    h = tanh(x @ p.W + context @ p.U + p.b + c)
    v.scatter(concat(h, c))
    v.push(h)


def attention_model():
    return cavs.Model(attention_cell, {"q": (H, 1), "W": (E, H), "U": (H, H), "b": (H,), "Wc": (E, H)},
                      state=2 * H, embedding=(V, E), classes=C, seed=2, dtype="float64")


def attention_reference(graphs, params):
    P = torch_params(params)
    zeros = lambda n: torch.zeros(n, dtype=torch.float64)     # noqa: E731
    total, count, probs = 0.0, 0, []
    for g in graphs:
        kids = kids_of(g)
        hs, cs = {}, {}
        for v in topological(kids):
            tok = int(g.tokens[v])
            x = P["emb"][tok] if tok >= 0 else zeros(E)
            if kids[v]:
                h_k = torch.stack([hs[k] for k in kids[v]])
                c_k = torch.stack([cs[k] for k in kids[v]])
                a = torch.softmax(h_k @ P["q"], dim=0)             # over the children
                context, carried = (a * h_k).sum(0), (a * c_k).sum(0)
            else:
                context, carried = zeros(H), zeros(H)
            cs[v] = carried + torch.sigmoid(x @ P["Wc"])
            hs[v] = torch.tanh(x @ P["W"] + context @ P["U"] + P["b"] + cs[v])
        logits = torch.stack([hs[v] for v in range(g.num_vertices)]) @ P["Wout"] + P["bout"]
        probs.append(torch.softmax(logits, dim=1).detach().numpy())
        labels = torch.as_tensor(np.asarray(g.labels))
        keep = labels >= 0
        total = total + torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum")
        count += int(keep.sum())
    loss = total / count
    loss.backward()
    return float(loss.detach()), {k: p.grad.numpy() for k, p in P.items()}, probs


@pytest.mark.parametrize("fusion", [False, True])
def test_attention_over_children_equals_pytorch(fusion):
    graphs = [dag(), *wide_trees(6)]
    model = attention_model()
    engine = cavs.Engine(model, fusion=fusion)
    check(engine, model, graphs, *attention_reference(graphs, dict(engine.params)))


def test_softmax_over_one_child_is_one_and_no_children_reduce_to_zeros():
    """A single child gets weight 1 (its state passes through); a vertex without children reads
    zeros from every reduction, never NaN."""
    chain = cavs.Graph.from_children([[], [0], [1]], tokens=[1, 2, 3], labels=[0, 1, 2], name="chain")
    model = attention_model()
    engine = cavs.Engine(model)
    loss, grads, probs = attention_reference([chain], dict(engine.params))
    check(engine, model, [chain], loss, grads, probs)

    def reductions(v, p):
        kids = v.children()
        h_k = kids.state
        r = h_k.sum() + h_k.mean() + h_k.max() + (kids.softmax(h_k) * h_k).sum() + v.pull()
        v.scatter(tanh(r))
        v.push(r)
    m = cavs.Model(reductions, {}, state=H, embedding=(V, H), classes=C, dtype="float64")
    leaves = cavs.Graph.from_children([[], []], tokens=[1, 2], labels=[0, 1], name="two leaves")
    e = cavs.Engine(m, fusion=False)
    e.loss_and_grads(m.make_batch([leaves]))
    pushed = e._low.arrays[e._low.slot[e._low.pushed]][:2]
    np.testing.assert_array_equal(pushed, e.params["emb"][[1, 2]])      # every reduction gave 0


# ---------------------------------------------------------------- every op

def every_op_cell(v, p, rate):
    x = v.pull()
    kids = v.children()
    h_k = kids.state
    mean, peak, total = h_k.mean(), h_k.max(), h_k.sum()
    z = sigmoid(x @ p.W + mean @ p.U + p.b)
    a = 0.5 * total + (1 - z) * peak - z / 2 + z ** 2 + kids.broadcast(z).sum() / 3
    a = a + cavs.exp(-cavs.abs(a)) + cavs.log(1 + cavs.exp(a * 0.1)) + np.tanh(a)
    a = cavs.maximum(a, peak) - cavs.minimum(a, 0.3) + cavs.maximum(0.0, a) + cavs.minimum(-0.2, z)
    d = a / (1.5 + cavs.abs(z)) - 2 / (3 + z * z)
    n = cavs.layer_norm(d, p.g, p.beta) + cavs.layer_norm(d)
    w = cavs.feature_sum(n) * (1.0 / H) + cavs.feature_mean(d) + v.num_children() * 0.1
    h = tanh(cavs.dropout(n * w, rate) + (h_k * kids.broadcast(d)).max())
    v.scatter(h)
    v.push(h)


def every_op_model(dropout=True):
    """(b, g and beta start away from the values that put a leaf on a kink of maximum / abs,
    where finite differences would straddle it.)"""
    rate = 0.3 if dropout else 0.0
    rng = np.random.default_rng(9)
    return cavs.Model(lambda v, p: every_op_cell(v, p, rate),
                      {"W": (E, H), "U": (H, H), "b": rng.uniform(0.2, 0.6, H), "g": rng.uniform(0.5, 1.5, H),
                       "beta": rng.uniform(-0.2, 0.2, H)},
                      state=H, embedding=(V, E), classes=C, seed=3, dtype="float64", name="every_op")


def layer_norm_t(d, g=None, b=None, eps=1e-5):
    centred = d - d.mean()
    y = centred * (centred.pow(2).mean() + eps) ** -0.5
    if g is not None:
        y = y * g + b
    return y


def every_op_reference(graphs, params, masks):
    """`masks`: per graph, the (n, H) dropout mask of each vertex (ones: no dropout)."""
    P = torch_params(params)
    zeros = lambda n: torch.zeros(n, dtype=torch.float64)     # noqa: E731
    total, count, probs = 0.0, 0, []
    for g, mask in zip(graphs, masks):
        kids = kids_of(g)
        hs = {}
        for v in topological(kids):
            tok = int(g.tokens[v])
            x = P["emb"][tok] if tok >= 0 else zeros(E)
            if kids[v]:
                h_k = torch.stack([hs[k] for k in kids[v]])
                mean, peak, tot = h_k.mean(0), h_k.amax(0), h_k.sum(0)
            else:
                h_k, mean, peak, tot = None, zeros(H), zeros(H), zeros(H)
            z = torch.sigmoid(x @ P["W"] + mean @ P["U"] + P["b"])
            a = 0.5 * tot + (1 - z) * peak - z / 2 + z ** 2 + len(kids[v]) * z / 3
            a = a + torch.exp(-torch.abs(a)) + torch.log(1 + torch.exp(a * 0.1)) + torch.tanh(a)
            a = torch.maximum(a, peak) - torch.minimum(a, torch.tensor(0.3, dtype=torch.float64)) \
                + torch.clamp(a, min=0.0) + torch.clamp(z, max=-0.2)
            d = a / (1.5 + torch.abs(z)) - 2 / (3 + z * z)
            n = layer_norm_t(d, P["g"], P["beta"]) + layer_norm_t(d)
            w = n.sum() / H + d.mean() + len(kids[v]) * 0.1
            edge_max = (h_k * d).amax(0) if kids[v] else zeros(H)
            hs[v] = torch.tanh(n * w * torch.as_tensor(mask[v]) + edge_max)
        logits = torch.stack([hs[v] for v in range(g.num_vertices)]) @ P["Wout"] + P["bout"]
        probs.append(torch.softmax(logits, dim=1).detach().numpy())
        labels = torch.as_tensor(np.asarray(g.labels))
        keep = labels >= 0
        total = total + torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum")
        count += int(keep.sum())
    loss = total / count
    loss.backward()
    return float(loss.detach()), {k: p.grad.numpy() for k, p in P.items()}, probs


def per_graph(mask, batch):
    offsets = batch.forest.offsets
    return [mask[offsets[i]:offsets[i + 1]] for i in range(batch.num_samples)]


@pytest.mark.parametrize("fusion", [False, True])
def test_a_model_using_every_op_equals_pytorch_with_the_same_dropout_mask(fusion):
    graphs = [dag(), *wide_trees(7)]
    model = every_op_model()
    engine = cavs.Engine(model, fusion=fusion)
    batch = model.make_batch(graphs)
    loss, grads = engine.loss_and_grads(batch)                        # a training pass: dropout on
    [mask] = engine.dropout_masks().values()
    assert set(np.unique(mask)) == {0.0, 1 / 0.7} and 0.2 < (mask == 0).mean() < 0.4
    ref_loss, ref_grads, _ = every_op_reference(graphs, dict(engine.params), per_graph(mask, batch))
    assert loss == pytest.approx(ref_loss, rel=1e-9)
    for k in grads:
        assert_close(grads[k], ref_grads[k], 1e-7, f"d{k}")
    # predict: dropout off (every mask one), the reference without dropout
    ones = [np.ones((g.num_vertices, H)) for g in graphs]
    _, _, probs = every_op_reference(graphs, dict(engine.params), ones)
    for got, want in zip(engine.predict(batch), probs):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_dropout_is_seeded_reproducible_and_new_each_pass():
    model, graphs = every_op_model(), [dag(), *wide_trees(8)[1:]]
    batch = model.make_batch(graphs)
    a, b = cavs.Engine(model, seed=11), cavs.Engine(model, seed=11)
    a.loss_and_grads(batch)
    b.loss_and_grads(batch)
    first = next(iter(a.dropout_masks().values()))
    np.testing.assert_array_equal(first, next(iter(b.dropout_masks().values())))
    a.loss_and_grads(batch)
    assert (next(iter(a.dropout_masks().values())) != first).any()
    assert a.infer(batch) == pytest.approx(cavs.Engine(model, seed=5).infer(batch), rel=1e-12)   # off in infer


# ---------------------------------------------------------------- what a user gets wrong

def model_of(cell, **kwargs):
    return cavs.Model(cell, {"W": (H, H), "q": (H, 1)}, state=H, inputs=H, classes=C, **kwargs)


def test_comparisons_and_branches_on_a_symbol_name_the_line():
    def compares(v, p):
        if v.pull() == 0:
            pass
        v.scatter(v.pull())

    def orders(v, p):
        mask = v.pull() > 0.5       # noqa: F841
        v.scatter(v.pull())
    for cell in (compares, orders):
        with pytest.raises(cavs.TraceError, match=r"test_edges.py:\d+: comparing a traced value"):
            model_of(cell)


def test_an_unsupported_op_names_itself_and_the_line():
    def sine(v, p):
        v.scatter(np.sin(v.pull()))

    def numpy_sum(v, p):
        v.scatter(np.sum(v.pull()))
    with pytest.raises(cavs.TraceError, match=r"test_edges.py:\d+ \(numpy.sin\): not an op of vertex functions"):
        model_of(sine)
    with pytest.raises(cavs.TraceError, match=r"test_edges.py:\d+ \(numpy.sum\): not an op"):
        model_of(numpy_sum)


def test_python_protocols_a_traced_value_lacks_name_the_line():
    """An unknown attribute, len(), float() and a NumPy array in F each name the user's line;
    hasattr() still answers False (the attribute error is an AttributeError too)."""
    cases = [(lambda h: h.T, r"test_edges.py:\d+ \(\.T\): a traced value has no attribute 'T'"),
             (lambda h: len(h), r"test_edges.py:\d+ \(len\): a traced value is one row vector"),
             (lambda h: float(h), r"test_edges.py:\d+: a traced value has no number while F is traced"),
             (lambda h: np.ones(H) + h, rf"test_edges.py:\d+ \(numpy.add\): a NumPy array of shape \({H},\) in F")]
    for use, message in cases:
        with pytest.raises(cavs.TraceError, match=message):
            model_of(lambda v, p, use=use: v.scatter(use(v.pull())))
    model_of(lambda v, p: (v.scatter(v.pull() if not hasattr(v.pull(), "T") else None), v.push(v.pull())))


def test_numpy_scalars_and_abs_are_ops():
    """np.float32(0.5) * h and np.sqrt(2) * h (a NumPy scalar first) and abs(h) trace to ops; the
    scalar first once recursed without end."""
    def scaled(v, p):
        h = v.pull()
        v.scatter(np.float32(0.5) * h + np.sqrt(2.0) * h - np.float64(1) + abs(h))
        v.push(h)
    ops = [n.op for n in model_of(scaled).F.nodes]
    assert ops.count("scale") == 2 and "shift" in ops and "abs" in ops


@pytest.mark.parametrize("rate", [1.0, -0.1, 2, "half"])
def test_a_dropout_rate_outside_0_1_is_refused(rate):
    def drops(v, p):
        v.scatter(cavs.dropout(v.pull(), rate))
    with pytest.raises(cavs.TraceError, match=r"test_edges.py:\d+ \(dropout\): the rate must be a number in \[0, 1\)"):
        model_of(drops)


def test_mixing_vertex_and_edge_values_and_slots_without_arity_are_named():
    def mixes(v, p):
        v.scatter(v.children().state + v.pull())

    def vertex_sum(v, p):
        v.scatter(v.pull().sum())

    def scatters_edges(v, p):
        v.scatter(v.children().state)

    def gathers(v, p):
        v.scatter(v.gather(0))
    with pytest.raises(cavs.TraceError, match=r"test_edges.py:\d+ \(add\): mixes a per-vertex value and a per-edge"):
        model_of(mixes)
    with pytest.raises(cavs.TraceError, match=r"\(edge_sum\): .* reduce a per-edge value .* cavs.feature_sum"):
        model_of(vertex_sum)
    with pytest.raises(cavs.TraceError, match=r"\(scatter\): the state is a per-vertex value"):
        model_of(scatters_edges)
    with pytest.raises(cavs.TraceError, match=r"\(gather\): gather\(k\) reads child slot k; declare the model's arity"):
        model_of(gathers)


def test_python_numbers_and_numpy_functions_are_ops():
    """`1 - h`, `0.5 * h`, `h / 2`, `h ** 2`, `2 / h`, np.exp(h) trace to ops (no TypeError)."""
    def arithmetic(v, p):
        h = v.pull()
        v.scatter(1 - h + 0.5 * h + h / 2 + h ** 2 + 2 / (3 + h * h) + np.exp(h) + np.maximum(h, 0))
        v.push(h)
    ops = {n.op for n in model_of(arithmetic).F.nodes}
    assert {"neg", "shift", "scale", "power", "exp", "max_const"} <= ops
    assert "div" in {n.op for n in model_of(lambda v, p: (v.scatter(v.pull() / (1 + v.pull() ** 2)),
                                                          v.push(v.pull()))).F.nodes}
    with pytest.raises(cavs.TraceError, match=r"\(div\): division by the constant 0"):
        model_of(lambda v, p: v.push(v.pull() / 0))


def test_any_degree_without_an_arity_and_the_slot_limit_with_one():
    model = edge_model()
    model.make_batch(wide_trees())                               # a vertex with 300 children: fine
    slots = child_sum.model(4, H, E, V, classes=C, dtype="float64")
    with pytest.raises(cavs.InputError, match=r"wide 300: vertex \d+ has 300 children, more than the vertex "
                                              r"function's arity 4"):
        slots.make_batch(wide_trees())


def test_broadcasting_a_parameter_names_the_line():
    def cell(v, p):
        kids = v.children()
        h_k, c_k = kids.state.split(2)
        v.scatter(concat(kids.broadcast(p.b) + h_k, c_k).sum())
    with pytest.raises(cavs.TraceError, match=r"test_edges.py:\d+ \(broadcast\): .* got a parameter; a parameter "
                                              r"needs no broadcast"):
        cavs.Model(cell, {"b": (H,)}, state=2 * H, inputs=E, classes=C)
