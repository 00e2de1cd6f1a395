"""The engine's boundary refuses what would otherwise fail silently: non-finite features and parameter
values, a threads setting that is not a count, a batch of another model, labels outside the head,
overflowed logits and diverged steps (NonFiniteError, the parameters untouched), float16, heads of
fewer than two classes, a backward after another pass; and a model without a head (classes=None)
is an encoder for forward / backward only."""
from __future__ import annotations

import numpy as np
import pytest

import cavs
from cavs.graphs import make_forest
from cavs.models import child_sum
from tests.engine.helpers import E, H, V, dag, feature_cell, nary_trees


def model(classes=5, hidden=H, **options):
    return child_sum.model(None, hidden, E, V, classes=classes, **{"seed": 1, "dtype": "float64", **options})


def unlabelled(graphs):
    """The graphs without labels: a model without a head takes no labels (the loss is the caller's)."""
    return [cavs.Graph(g.children, g.tokens, np.full_like(g.labels, -1), g.name) for g in graphs]


def snapshot(engine) -> dict:
    state = {f"optim/{k}": np.array(v) for k, v in engine.optimizer.state_dict(np.asarray).items() if k != "steps"}
    return {**{k: engine.params[k].copy() for k in engine.params}, **state}


def assert_unchanged(engine, before):
    after = snapshot(engine)
    assert set(after) == set(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_non_finite_features_are_refused_naming_graph_and_vertex():
    m = cavs.Model(feature_cell, {"W": (3, 4), "U": (4, 4), "b": (4,)}, arity=2, state=4, inputs=3, classes=2)
    x = np.zeros((3, 3))
    x[2, 1] = np.nan
    good = cavs.Graph.from_children([[], [0]], features=np.zeros((2, 3)), labels=[0, 1], name="fine")
    bad = cavs.Graph.from_children([[], [], [0, 1]], features=x, labels=[0, 1, 1], name="with a nan")
    with pytest.raises(cavs.InputError, match=r"with a nan: vertex 2 has a non-finite feature \(nan\)"):
        m.make_batch([good, bad])


def test_non_finite_inputs_to_forward_are_refused_naming_graph_and_vertex():
    enc = model(classes=None)
    engine = cavs.Engine(enc, fusion=False)
    batch = enc.make_batch(unlabelled(nary_trees()[1:3]))
    x = np.zeros((batch.num_vertices, E))
    x[batch.graph_slices[1].start + 3, 0] = np.inf
    with pytest.raises(ValueError, match=r"inputs: tree b: vertex 3 \(row \d+\) has a non-finite value"):
        engine.forward(batch, inputs=x)


def test_inputs_and_output_gradients_that_are_not_numbers_are_refused_naming_them():
    enc = model(classes=None)
    engine = cavs.Engine(enc, fusion=False)
    batch = enc.make_batch(unlabelled(nary_trees()[1:3]))
    with pytest.raises(ValueError, match=r"inputs must be a numeric array, got ndarray of dtype object"):
        engine.forward(batch, inputs=np.full((batch.num_vertices, E), None))   # not "a non-finite value"
    out = engine.forward(batch)
    with pytest.raises(ValueError, match=r"d_out must be a numeric array, got str"):
        engine.backward("zeros")
    engine.backward(np.zeros_like(out))


def test_non_finite_parameter_values_are_refused_naming_the_parameter(tmp_path):
    bias = np.zeros(4)
    bias[2] = np.nan
    with pytest.raises(ValueError, match=r"parameter 'b': 1 of its 4 values are not finite \(the first, at index 2, is nan\)"):
        cavs.Model(feature_cell, {"W": (3, 4), "U": (4, 4), "b": bias}, arity=2, state=4, inputs=3, classes=2)
    engine = cavs.Engine(model(), fusion=False)
    w = engine.params["Uf"].copy()
    before = snapshot(engine)
    w[1, 0] = -np.inf
    with pytest.raises(ValueError, match=r"parameter 'Uf': 1 of its \d+ values are not finite \(the first, at index \(1, 0\), is -inf\)"):
        engine.params["Uf"] = w
    assert_unchanged(engine, before)
    with pytest.raises(KeyError, match=r"no parameter 'Wx'; .* has emb, W, U, b"):
        engine.params["Wx"] = w
    for wrong in (np.full(w.shape, "a"), np.full(w.shape, None), w.astype(complex)):
        with pytest.raises(ValueError, match=rf"parameter Uf takes real numbers, got an array of dtype {wrong.dtype}"):
            engine.params["Uf"] = wrong
    assert_unchanged(engine, before)
    assert "Wx" not in engine.params and "Uf" in engine.params
    engine.save(tmp_path / "fine.npz")
    with np.load(tmp_path / "fine.npz") as f:
        saved = {k: f[k] for k in f.files}
    saved["param/Uf"] = w
    np.savez(tmp_path / "corrupt.npz", **saved)
    with pytest.raises(ValueError, match=r"corrupt.npz: parameter 'Uf': 1 of its"):
        cavs.Engine.load(tmp_path / "corrupt.npz", model(), fusion=False)



def test_save_writes_the_path_it_is_given_and_load_names_a_file_it_did_not_write(tmp_path):
    engine = cavs.Engine(model(), fusion=False)
    engine.save(tmp_path / "bare")                 # np.savez alone would write bare.npz, and load("bare") fail
    assert [p.name for p in tmp_path.iterdir()] == ["bare"]
    again = cavs.Engine.load(tmp_path / "bare", model(), fusion=False)
    np.testing.assert_array_equal(again.params["Uf"], engine.params["Uf"])
    (tmp_path / "text.npz").write_text("not an archive")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    for name in ("text.npz", "other.npz"):
        with pytest.raises(ValueError, match=rf"{name}: not a file written by Engine.save"):
            cavs.Engine.load(tmp_path / name, model(), fusion=False)


def test_threads_must_be_none_or_a_non_negative_integer():
    for threads in (-1, 2.5, "2", True):
        with pytest.raises(ValueError, match=r"threads must be a positive integer \(or None or 0 .*got"):
            cavs.Engine(model(), fusion=False, threads=threads)


def test_engine_options_of_the_wrong_kind_are_named():
    torch = pytest.importorskip("torch")
    for optimizer, said in (("adam", "got str"), (cavs.optim.Adam, r"got the class Adam \(give an instance"),
                            (torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1), "got torch.optim.sgd.SGD")):
        with pytest.raises(TypeError, match=r"optimizer must be a cavs optimizer .*" + said):
            cavs.Engine(model(), fusion=False, optimizer=optimizer)
    with pytest.raises(TypeError, match="the engine takes a cavs.Model .*got function"):
        cavs.Engine(lambda v, p: None)
    with pytest.raises(TypeError, match=r"fusion must be True or False \(or None: the default\), got 'no'"):
        cavs.Engine(model(), fusion="no")             # a truthy string would have meant fusion on
    with pytest.raises(ValueError, match="seed must be a whole number of at least 0"):
        cavs.Engine(model(), fusion=False, seed="a")
    assert cavs.Engine(model(), fusion=False, frozen="emb").frozen == {"emb"}     # one name, not its letters


def test_model_sizes_and_parameter_values_are_checked_where_they_are_given():
    def cell(v, p):
        h = v.pull() @ p.W + p.b
        v.scatter(h)
        v.push(h)

    def build(params=None, **options):
        return cavs.Model(cell, params or {"W": (3, 4), "b": (4,)}, **{"state": 4, "inputs": 3, "classes": None,
                                                                       **options})
    # a list of floats is the initial values (it was taken for a shape, and the engine failed in NumPy)
    engine = cavs.Engine(build({"W": (3, 4), "b": [0.5, 0.5, 0.5, 1.5]}), fusion=False)
    np.testing.assert_array_equal(engine.params["b"], [0.5, 0.5, 0.5, 1.5])
    assert cavs.Engine(build({"W": [3, 4], "b": [4]}), fusion=False).params["W"].shape == (3, 4)
    for options, said in ((dict(params={"W": (3.0, 4), "b": (4,)}), r"'W': shape \(3.0, 4\) must be whole numbers"),
                          (dict(params={"W": (3, 4), "b": []}), "'b': give a shape tuple or a numeric array, got an "
                                                               "empty list"),
                          (dict(state=0), "state must be a whole number of at least 1, got 0"),
                          (dict(state="4"), "state must be a whole number of at least 1, got '4'"),
                          (dict(inputs=0), "inputs must be a whole number of at least 1"),
                          (dict(inputs=None, embedding=(10,)), r"embedding must be a pair \(V, E\)"),
                          (dict(inputs=None, embedding=(10, 0)), "embedding's width E must be a whole number"),
                          (dict(seed=-1), "seed must be a whole number of at least 0"),
                          (dict(dtype="floaty"), "dtype 'floaty' is not a NumPy dtype")):
        with pytest.raises(ValueError, match=said):
            build(**options)


@pytest.mark.parametrize("other", [dict(hidden=H + 1), dict(classes=3)], ids=["sizes", "classes"])
def test_a_batch_of_another_model_is_refused_naming_both(other):
    mine, theirs = model(), model(**other)
    batch = theirs.make_batch([dag()])
    with pytest.raises(ValueError, match="made by model .*" + str(theirs.describe()).replace("(", r"\(").replace(")", r"\)")
                       + ".* this engine runs model .*" + mine.describe().replace("(", r"\(").replace(")", r"\)")):
        cavs.Engine(mine, fusion=False).loss_and_grads(batch)
    cavs.Engine(mine, fusion=False).loss_and_grads(model().make_batch([dag()]))    # an equal model's: fine


def test_graphs_instead_of_a_batch_are_refused_with_the_fix():
    mine = model()
    engine = cavs.Engine(mine, fusion=False)
    for wrong in (dag(), [dag()]):
        with pytest.raises(TypeError, match=r"takes a cavs.Batch, got (Graph|list): make one with "
                                            r"engine.model.make_batch\(graphs\)"):
            engine.step(wrong)


def test_make_batch_takes_any_iterable_of_graphs_but_not_one_graph():
    mine = model()
    graphs = [dag(), *nary_trees(2)]
    want = mine.make_batch(graphs).forest
    for given in (tuple(graphs), (g for g in graphs)):
        np.testing.assert_array_equal(mine.make_batch(given).forest.edge_child, want.edge_child)
    with pytest.raises(TypeError, match=r"make_batch takes a list of graphs, got one cavs.Graph; write "
                                        r"make_batch\(\[graph\]\)"):
        mine.make_batch(dag())
    with pytest.raises(TypeError, match="make_batch takes a list of graphs, got int"):
        mine.make_batch(5)


def test_a_training_batch_without_a_label_warns():
    mine = model()
    engine = cavs.Engine(mine, fusion=False)
    batch = mine.make_batch(unlabelled([dag()]))
    with pytest.warns(UserWarning, match=r"no vertex of this batch has a label .*: its loss is 0"):
        assert engine.step(batch) == 0.0
    engine.predict(batch)          # predictions need no labels


def test_a_label_beyond_the_head_fails_clearly_however_the_batch_was_made():
    g = cavs.Graph.from_children([[], [0]], tokens=[1, 2], labels=[1, 4], name="label four")
    three = model(classes=3)
    with pytest.raises(cavs.InputError, match=r"label four: vertex 1 has label 4, outside 0..2 \(or -1 for no loss\)"):
        three.make_batch([g])
    with pytest.raises(ValueError, match="made by model .*5 classes.* runs model .*3 classes"):
        cavs.Engine(three, fusion=False).step(model(classes=5).make_batch([g]))
    # a Batch built by hand (no model): checked against the engine's model, not read past the head
    engine = cavs.Engine(three, fusion=False)
    before = snapshot(engine)
    with pytest.raises(cavs.InputError, match=r"label four: vertex 1 has label 4, outside 0..2"):
        engine.step(cavs.Batch(make_forest([g], None)))
    assert_unchanged(engine, before)


def huge_logits(engine, scale):
    """Saturated gates (every hidden value near 0.76) and the head's weights and biases at
    +-`scale` (float32): logits of several times `scale`, beyond float32's 3.4e38 at scale 3e38."""
    engine.params["b"] = np.full(engine.params["b"].shape, 5.0, dtype=np.float32)
    w = np.full(engine.params["Wout"].shape, scale, dtype=np.float32)
    w[:, 1::2] *= -1
    engine.params["Wout"] = w
    engine.params["bout"] = np.full(w.shape[1], scale, dtype=np.float32)


def test_huge_finite_logits_give_a_loss_above_zero_and_overflowed_ones_raise_updating_nothing():
    m = model(dtype="float32")
    batch = m.make_batch(nary_trees())
    engine = cavs.Engine(m, fusion=False)
    labels = batch.forest.labels
    for scale in (1e10, 1e25, 1e30):       # float32's loss kernel against float64 on the same outputs
        huge_logits(engine, scale)
        z = engine.forward(batch, train=False).astype(np.float64) @ engine.params["Wout"] + engine.params["bout"]
        z = z[labels >= 0]
        top = z.max(axis=1)
        want = np.mean(np.log(np.exp(z - top[:, None]).sum(axis=1)) + top - z[np.arange(len(z)), labels[labels >= 0]])
        assert engine.infer(batch) == pytest.approx(want, rel=1e-6), scale
    huge_logits(engine, 3e38)                     # h Wout + bout overflows to inf
    assert not engine.infer(batch) < 0            # NaN, never a negative number
    before = snapshot(engine)
    with pytest.raises(cavs.NonFiniteError, match="not finite; the parameters were not updated"):
        engine.step(batch)
    assert_unchanged(engine, before)
    skipping = cavs.Engine(m, fusion=False, on_nonfinite="skip", optimizer=cavs.optim.Adagrad(lr=0.1))
    huge_logits(skipping, 3e38)
    before = snapshot(skipping)
    assert not skipping.step(batch) < 0
    assert skipping.skipped_steps == 1
    assert_unchanged(skipping, before)
    assert issubclass(cavs.NonFiniteError, ArithmeticError) and "NonFiniteError" in cavs.__all__


def test_a_backward_pass_that_overflows_names_the_gradients_and_float64():
    """A ladder DAG (two vertices per level, each the child of both above it) doubles its paths at
    every level: after 300 levels float32's gradients overflow while the loss stays finite."""
    lists = [[], []] + [[2 * (level - 1), 2 * level - 1] for level in range(1, 300) for _ in range(2)]
    ladder = cavs.Graph.from_children(lists, tokens=np.arange(len(lists)) % 7,
                                      labels=[-1] * (len(lists) - 1) + [1], name="ladder")
    with pytest.raises(cavs.NonFiniteError, match=r"ladder, \.\.\.\) gives a finite loss \([\d.]+\) but gradients that "
                                                  r"are not finite \(W, U, .*\): the backward pass overflowed float32 .*"
                                                  r"dtype='float64' has more range"):
        cavs.Engine(model(dtype="float32"), fusion=False).step(model(dtype="float32").make_batch([ladder]))
    assert np.isfinite(cavs.Engine(model(), fusion=False).step(model().make_batch([ladder])))    # float64


def test_float32_sgd_diverging_at_lr_1e6_never_reports_a_negative_loss():
    m = model(dtype="float32")
    batch = m.make_batch(nary_trees())
    engine = cavs.Engine(m, fusion=False, optimizer=cavs.optim.SGD(lr=1e6))
    losses = []
    for _ in range(30):
        try:
            losses.append(engine.step(batch))
        except cavs.NonFiniteError:       # the step that would have made the parameters non-finite
            break
    assert max(losses) > 1000 * losses[0], f"no divergence at lr 1e6: {losses}"
    assert all(loss >= 0 for loss in losses), losses


def test_float16_and_heads_of_fewer_than_two_classes_are_refused():
    with pytest.raises(ValueError, match="dtype float16 is not supported end to end.*use float32"):
        model(dtype="float16")
    for classes in (1, 0, True, 2.5):
        with pytest.raises(ValueError, match=r"classes must be an integer >= 2 .*or None for no head"):
            model(classes=classes)


def test_a_model_without_a_head_is_an_encoder():
    enc = model(classes=None)
    assert not enc.has_head and "Wout" not in enc.param_shapes
    engine = cavs.Engine(enc, fusion=False)
    batch = enc.make_batch(unlabelled([dag()]))
    for call in (engine.step, engine.infer, engine.predict, engine.loss_and_grads):
        with pytest.raises(ValueError, match=r"applies the built-in softmax head.*none \(classes=None\): use "
                                             r"engine.forward / engine.backward"):
            call(batch)
    out = engine.forward(batch)
    assert out.shape == (batch.num_vertices, H)
    grads = engine.backward(np.ones_like(out))
    assert set(grads) == set(enc.param_shapes)
    with pytest.raises(cavs.InputError, match="has label 1, but the model has no head"):
        enc.make_batch([cavs.Graph.from_children([[]], tokens=[1], labels=[1], name="labelled")])


def test_backward_after_another_pass_is_refused():
    """The buffers a backward reads belong to the last pass: after a step (or predict, infer) in
    between, a backward of the earlier forward raises instead of reading the other pass's."""
    m = model()
    engine = cavs.Engine(m, fusion=False)
    batch = m.make_batch(nary_trees())
    out = engine.forward(batch)
    engine.predict(m.make_batch([dag()]))
    with pytest.raises(RuntimeError, match="needs a forward first"):
        engine.backward(np.ones_like(out))
    out = engine.forward(batch)
    engine.backward(np.ones_like(out))            # paired: fine
    with pytest.raises(RuntimeError, match="needs a forward first"):
        engine.backward(np.ones_like(out))        # once per forward


def test_sparse_embedding_gradients_are_the_dense_ones_rows():
    enc = model(classes=None)
    engine = cavs.Engine(enc, fusion=False)
    batch = enc.make_batch(unlabelled(nary_trees()))
    d = np.random.default_rng(0).normal(size=(batch.num_vertices, H))
    engine.forward(batch)
    dense = engine.backward(d)["emb"]
    engine.forward(batch)
    rows, values = engine.backward(d, sparse=True)["emb"]
    np.testing.assert_array_equal(rows, np.unique(batch.forest.tokens[batch.forest.tokens >= 0]))
    np.testing.assert_allclose(values, dense[rows], rtol=1e-12)
    assert not np.delete(dense, rows, axis=0).any()
