"""The PyTorch baselines (per-sample, cuDNN LSTM, Fold, by level): the spec's math, gradients, Fold's schedule,
and agreement with each other. tests/test_cross_system.py compares them with the Cavs engine."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from baselines import get_system  # noqa: E402
from baselines.fold import merge, schedule  # noqa: E402
from cavs import workloads  # noqa: E402
from cavs.graphs import InputError, levels  # noqa: E402
from cavs.readers import SourceLine, parse_ptb_tree  # noqa: E402

H = 5
KW = dict(hidden=H, batch_size=4, seed=2, leaves=8)


def make(system, workload, **kw):
    return get_system(system)(workload, **{**KW, **kw})


def spec_loss(workload, p, g):
    """docs/workloads.md written out in NumPy, one vertex at a time: the independent check of gate orders."""
    sig = lambda z: 1 / (1 + np.exp(-z))   # noqa: E731
    h = p["Wout"].shape[0]
    zero = (np.zeros(h), np.zeros(h))
    state = {}
    for v in np.argsort(levels(g.children), kind="stable"):
        x = p["emb"][g.tokens[v]] if g.tokens[v] >= 0 else np.zeros(p["emb"].shape[1])
        (hl, cl), (hr, cr) = [state[c] if c >= 0 else zero for c in g.children[v]] + [zero] * (2 - g.arity)
        if workload == "tree_fc":
            state[v] = (np.tanh(np.concatenate([hl, hr]) @ p["W"] + x + p["b"]), None)
            continue
        if workload == "tree_lstm":
            i, fl, fr, o, u = np.split(x @ p["Wx"] + np.concatenate([hl, hr]) @ p["Uh"] + p["b"], 5)
            c = sig(i) * np.tanh(u) + sig(fl) * cl + sig(fr) * cr
        else:
            i, f, o, u = np.split(x @ p["Wx"] + hl @ p["Wh"] + p["b"], 4)
            c = sig(f) * cl + sig(i) * np.tanh(u)
        state[v] = (sig(o) * np.tanh(c), c)
    loss = 0.0
    for v in np.flatnonzero(g.labels >= 0):
        z = state[v][0] @ p["Wout"] + p["bout"]
        loss += np.log(np.exp(z - z.max()).sum()) + z.max() - z[g.labels[v]]
    return loss


def batch_spec_loss(workload, params, samples):
    """The batch's mean loss: summed over its graphs, divided by its labelled vertices."""
    graphs = [workloads.to_graph(workload, s, i) for i, s in enumerate(samples)]
    return sum(spec_loss(workload, params, g) for g in graphs) / sum(int((g.labels >= 0).sum()) for g in graphs)


def assert_same_step(system, workload, samples, dtype="float64", tol=1e-6, **kw):
    """`system` and per-sample PyTorch: same loss, same parameters after one SGD step."""
    ref, sut = make("pytorch", workload, dtype=dtype), make(system, workload, dtype=dtype, **kw)
    ref_loss, loss = ref.step(ref.prepare(samples)), sut.step(sut.prepare(samples))
    assert loss == pytest.approx(ref_loss, rel=tol)
    got, want = sut.get_params(), ref.get_params()
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == np.dtype(dtype)
        assert np.abs(got[name] - want[name]).max() <= tol * max(1.0, np.abs(want[name]).max()), name
    return sut


@pytest.mark.parametrize("workload", workloads.WORKLOADS)
def test_per_sample_loss_is_the_spec(workload, small_samples):
    system = make("pytorch", workload, dtype="float64", mode="infer")
    loss = system.step(system.prepare(small_samples[workload]))
    assert loss == pytest.approx(batch_spec_loss(workload, system.get_params(), small_samples[workload]), rel=1e-10)


@pytest.mark.parametrize("workload", ["tree_fc", "tree_lstm"])
def test_per_sample_sgd_step_matches_finite_differences(workload, small_samples, monkeypatch):
    monkeypatch.setattr(workloads, "CLIP_NORM", 1e30)    # no clipping: the step is -lr * gradient
    samples = small_samples[workload][:2]
    system = make("pytorch", workload, dtype="float64")
    before = system.get_params()
    system.step(system.prepare(samples))
    grads = {k: (before[k] - v) / workloads.LEARNING_RATE for k, v in system.get_params().items()}
    rng, eps = np.random.default_rng(0), 1e-6
    for name, grad in grads.items():
        # the largest gradient entry, and a random one (mostly exact zeros for embeddings)
        for idx in (np.unravel_index(np.abs(grad).argmax(), grad.shape), tuple(rng.integers(grad.shape))):
            moved = {k: v.copy() for k, v in before.items()}
            moved[name][idx] += eps
            up = batch_spec_loss(workload, moved, samples)
            moved[name][idx] -= 2 * eps
            fd = (up - batch_spec_loss(workload, moved, samples)) / (2 * eps)
            assert grad[idx] == pytest.approx(fd, abs=1e-6), f"{name}{idx}"


@pytest.mark.parametrize("system,workload", [("pytorch", "tree_lstm"), ("pytorch", "var_lstm"),
                                             ("fold", "tree_fc"), ("cudnn", "var_lstm")])
def test_gradients_are_clipped_to_the_global_norm(system, workload, small_samples, monkeypatch):
    """With a threshold below the gradient's global L2 norm (all parameters together, the
    embedding's rows used twice summed), the step is -lr * threshold * g / ||g||."""
    samples = small_samples[workload]
    runs = {}
    for clip in (1e30, 0.01):
        monkeypatch.setattr(workloads, "CLIP_NORM", clip)
        sut = make(system, workload, dtype="float64")
        before = sut.get_params()
        sut.step(sut.prepare(samples))
        runs[clip] = {k: before[k] - v for k, v in sut.get_params().items()}   # lr * (clipped) gradient
    raw = runs[1e30]
    norm = np.sqrt(sum((g ** 2).sum() for g in raw.values())) / workloads.LEARNING_RATE
    assert norm > 0.01
    for name, step in runs[0.01].items():
        np.testing.assert_allclose(step, raw[name] * 0.01 / (norm + 1e-6), rtol=0, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("system,workload", [("cudnn", "fixed_lstm"), ("cudnn", "var_lstm"),
                                             ("fold", "tree_fc"), ("fold", "tree_lstm"),
                                             ("pytorch-levels", "tree_fc"), ("pytorch-levels", "tree_lstm")])
def test_batched_systems_equal_per_sample(system, workload, small_samples):
    sut = assert_same_step(system, workload, small_samples[workload])
    t = sut.timings
    assert (t.samples, t.steps, t.memory_s) == (len(small_samples[workload]), 1, None)
    assert t.construct_s > 0 and t.compute_s > 0


@pytest.mark.parametrize("system,workload", [("cudnn", "var_lstm"), ("fold", "tree_lstm"),
                                             ("pytorch-levels", "tree_lstm")])
def test_float32(system, workload, small_samples):
    assert_same_step(system, workload, small_samples[workload], dtype="float32", tol=1e-4)


def test_fold_n_equals_fold_1(small_samples):
    sut = assert_same_step("fold", "tree_lstm", small_samples["tree_lstm"], workers=2)
    assert sut.timings.extra["workers"] == 2


@pytest.mark.parametrize("system,workload", [("pytorch", "tree_lstm"), ("cudnn", "var_lstm"), ("fold", "tree_fc"),
                                             ("pytorch-levels", "tree_lstm")])
def test_infer_gives_the_loss_and_leaves_parameters(system, workload, small_samples):
    train, infer = make(system, workload, dtype="float64"), make(system, workload, dtype="float64", mode="infer")
    samples = small_samples[workload]
    assert infer.step(infer.prepare(samples)) == pytest.approx(train.step(train.prepare(samples)), rel=1e-12)
    for name, value in infer.get_params().items():
        np.testing.assert_array_equal(value, workloads.init_params(workload, H, 2, "float64", 8)[name])


@pytest.mark.parametrize("system", ["pytorch-levels", "fold"])
def test_unary_vertices_and_mixed_levels(system):
    """A unary vertex (one child absent) and levels where only some rows have a token or children:
    the level-batched paths that index_add into a subset of a level's rows."""
    samples = ["(1 (2 (3 a)) (4 (2 b) (0 c)))", "(3 (1 (2 d)))", "(2 e)", "(0 (1 f) (2 (3 g) (4 h)))"]
    vocab_sut = assert_same_step(system, "tree_lstm", samples)
    assert vocab_sut.timings.steps == 1


@pytest.mark.slow
@pytest.mark.parametrize("compile_cell", [False, True])
def test_pytorch_levels_compiled_cell_is_the_same(compile_cell, small_samples):
    """torch.compile on the level cell (the `compile` option) computes the eager cell's numbers."""
    if compile_cell:
        pytest.importorskip("torch._inductor")
    sut = assert_same_step("pytorch-levels", "tree_fc", small_samples["tree_fc"], compile=compile_cell)
    assert sut.timings.extra["compiled"] is compile_cell


def test_fold_schedule_carries_shallow_children_up():
    # depths: leaves a, b, c, d = 0; (c d) = 1; (b (c d)) = 2; root = 3.
    # b is read at depth 2, so one copy (depth 1); a is read at depth 3, so two copies (depths 1, 2)
    g, _ = parse_ptb_tree("(1 (2 a) (3 (2 b) (4 (2 c) (2 d))))", {"a": 1, "b": 2, "c": 3, "d": 4})
    plan = schedule(g)
    assert [len(lv.tokens) for lv in plan] == [4, 1, 1, 1]
    assert [len(lv.copies) for lv in plan] == [0, 2, 1, 0]
    # the root reads a's second copy (row 1 of depth 2: after the one cell) and the cell (b (c d))
    np.testing.assert_array_equal(plan[3].children, [[1, 0]])
    # numbering vertices root-first instead of post-order changes no count
    perm = np.arange(g.num_vertices)[::-1]
    inv = np.argsort(perm)
    g.children, g.tokens, g.labels = np.where(g.children >= 0, inv[g.children], -1)[perm], g.tokens[perm], g.labels[perm]
    assert [(len(lv.tokens), len(lv.copies)) for lv in schedule(g)] == [(4, 0), (1, 2), (1, 1), (1, 0)]


def test_fold_prepare_counts_depths_and_copies():
    fold = make("fold", "tree_lstm")
    batch = fold.prepare(["(1 (2 a) (3 (2 b) (4 (2 c) (2 d))))", "(0 (1 e) (2 f))"])
    assert (len(batch.ops), batch.num_cells, batch.num_copies) == (4, 10, 3)
    assert (fold.timings.extra["cells"], fold.timings.extra["copies"]) == (10, 3)


def test_fold_merge_lines_up_samples_of_different_depths():
    deep, _ = parse_ptb_tree("(1 (2 a) (3 (2 b) (4 (2 c) (2 d))))", None)
    flat, _ = parse_ptb_tree("(0 (1 e) (2 f))", None)
    merged = merge([schedule(flat), schedule(deep)])
    assert [len(lv.tokens) for lv in merged] == [6, 2, 1, 1]
    assert [len(lv.copies) for lv in merged] == [0, 2, 1, 0]
    # depth 0 rows: e f a b c d. Depth 1: cells [flat's root, (c d)] read rows 0, 1 and 4, 5;
    # copies of a and b come from rows 2 and 3 (and land on rows 2 and 3)
    np.testing.assert_array_equal(merged[1].children, [[0, 1], [4, 5]])
    np.testing.assert_array_equal(merged[1].copies, [2, 3])
    # depth 2: (b (c d)) reads b's copy (row 3) and (c d) (row 1); a's copy moves up from row 2
    np.testing.assert_array_equal(merged[2].children, [[3, 1]])
    np.testing.assert_array_equal(merged[2].copies, [2])
    np.testing.assert_array_equal(merged[3].children, [[1, 0]])


@pytest.mark.parametrize("system,options", [("pytorch", {}), ("fold", {}), ("fold", {"workers": 2})])
def test_malformed_sst_line_names_the_line(system, options):
    sut = make(system, "tree_lstm", **options)
    good = SourceLine("(3 (2 good) (2 film))", "train.txt:6")
    with pytest.raises(InputError, match=r"train\.txt:7: unbalanced"):
        sut.prepare([good, SourceLine("(3 (2 good) (2 film)", "train.txt:7")])


def test_cudnn_rejects_ragged_fixed_lstm_batch():
    with pytest.raises(InputError, match="sample 1"):
        make("cudnn", "fixed_lstm").prepare([list(range(9)), list(range(7))])


@pytest.mark.parametrize("workload,dtype", [("fixed_lstm", "float32"), ("var_lstm", "float32"),
                                            ("fixed_lstm", "float64")])
def test_cudnn_reports_the_kernel_that_ran(workload, dtype, small_samples):
    sut = make("cudnn", workload, dtype=dtype)
    batch = sut.prepare(small_samples[workload])
    with torch.autograd.profiler.profile() as prof:
        sut.step(batch)
    ran = {e.name for e in prof.function_events}
    assert ("aten::mkldnn_rnn_layer" in ran) == (sut.timings.extra["kernel"] == "onednn")
