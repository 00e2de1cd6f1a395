"""The engine against plain PyTorch per sample, across policies and batch compositions, and its
memory accounting, on real SST/PTB samples and tiny hand-made graphs."""
import re

import numpy as np
import pytest

import cavs
from cavs.graphs import Graph, make_forest
from tests.conftest import backend_name
from tests.test_graphs import MALFORMED_TREES

torch = pytest.importorskip("torch")
from baselines.pytorch_sample import PytorchSampleSystem  # noqa: E402


def engine_for(workload, policy="batched", hidden=5, reduction="mean", **options):
    model = cavs.models.build(workload, hidden=hidden, seed=3, dtype="float64", leaves=8, reduction=reduction)
    return model, cavs.Engine(model, backend=backend_name(), policy=policy, **options)


def torch_loss_and_grads(workload, samples, params, hidden=5):
    """Plain PyTorch per sample with the same weights: loss and every parameter's gradient."""
    ref = PytorchSampleSystem(workload, hidden=hidden, batch_size=len(samples), dtype="float64", leaves=8)
    ref.set_params(params)
    ps = ref.params
    batch = ref.prepare(samples)
    rows = ps["emb"].index_select(0, batch.used_rows).requires_grad_()   # the rows the batch reads
    loss = ref.loss(batch, rows)
    loss.backward()
    grads = {k: p.grad.numpy() for k, p in ps.items() if k != "emb"}
    grads["emb"] = torch.zeros_like(ps["emb"]).index_add_(0, batch.used_rows, rows.grad).numpy()
    return float(loss.detach()), grads


def assert_close(got, want, rel, what):
    scale = max(1e-12, float(np.abs(want).max()))
    err = float(np.abs(np.asarray(got) - want).max()) / scale
    assert err <= rel, f"{what}: relative error {err:.2e} > {rel}"


@pytest.mark.parametrize("workload", cavs.workloads.WORKLOADS)
def test_loss_and_every_gradient_equal_pytorch(workload, small_samples):
    model, engine = engine_for(workload)
    samples = small_samples[workload]
    loss, grads = engine.loss_and_grads(model.make_batch(samples))
    ref_loss, ref_grads = torch_loss_and_grads(workload, samples, dict(engine.params))
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert set(grads) == set(ref_grads)
    for name in grads:
        assert_close(grads[name], ref_grads[name], 1e-6, f"{workload} d/d{name}")


@pytest.mark.parametrize("workload", cavs.workloads.WORKLOADS)
def test_batched_and_serial_policies_agree(workload, small_samples):
    samples = small_samples[workload]
    results = []
    for policy in ("batched", "serial"):
        model, engine = engine_for(workload, policy)
        results.append(engine.loss_and_grads(model.make_batch(samples)))
    (l1, g1), (l2, g2) = results
    assert l1 == pytest.approx(l2, rel=1e-12)
    for name in g1:
        assert_close(g1[name], g2[name], 1e-10, f"{workload} serial vs batched d/d{name}")


@pytest.mark.parametrize("workload", ["tree_lstm", "var_lstm"])
def test_sample_contribution_independent_of_batch_mates_and_order(workload, small_samples):
    samples = small_samples[workload]
    model, engine = engine_for(workload, reduction="sum")    # a sum: each sample's terms add up
    alone = [engine.loss_and_grads(model.make_batch([s])) for s in samples]
    together = engine.loss_and_grads(model.make_batch(samples))
    shuffled = engine.loss_and_grads(model.make_batch(samples[::-1]))
    assert together[0] == pytest.approx(sum(l for l, _ in alone), rel=1e-12)
    assert shuffled[0] == pytest.approx(together[0], rel=1e-12)
    for name in together[1]:
        summed = sum(g[name] for _, g in alone)
        assert_close(together[1][name], summed, 1e-10, f"batch vs per-sample sum d/d{name}")
        assert_close(shuffled[1][name], together[1][name], 1e-10, f"reordered batch d/d{name}")


def test_step_applies_the_default_rule_and_infer_matches_forward(small_samples):
    """WORKLOADS.md's rule: SGD, lr 1.0, on the mean loss, gradients clipped to a global norm of 5."""
    model, engine = engine_for("tree_lstm")
    batch = model.make_batch(small_samples["tree_lstm"])
    before = {k: v.copy() for k, v in engine.params.items()}
    loss, grads = engine.loss_and_grads(batch)
    assert engine.infer(batch) == pytest.approx(loss, rel=1e-12)
    assert engine.step(batch) == pytest.approx(loss, rel=1e-12)
    norm = np.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    coef = min(1.0, 5.0 / (norm + 1e-6))
    for name, g in grads.items():
        np.testing.assert_allclose(engine.params[name], before[name] - coef * g, rtol=1e-12, atol=1e-14)


def test_only_message_ops_move_memory():
    """Tree-FC, two complete trees of 4 leaves, h = 3, float64: exact bytes per message op."""
    model = cavs.models.build("tree_fc", hidden=3, seed=0, dtype="float64", leaves=4)
    engine = cavs.Engine(model, backend=backend_name())
    batch = model.make_batch(cavs.datasets.tree_fc_samples(2, leaves=4, seed=1))
    engine.loss_and_grads(batch)
    row = 3 * 8
    internal = 2 * 3                               # 3 internal vertices per tree
    assert set(engine.counters.bytes_moved) == {"gather", "scatter", "pull", "push"}
    assert engine.counters.bytes_moved["gather"] == 2 * internal * row      # two children each
    assert engine.counters.bytes_moved["scatter"] == 2 * internal * row     # their gradients back
    assert engine.counters.bytes_moved["pull"] == 2 * 4 * row               # leaf embeddings in
    # out: the two roots' pushed rows to the loss, and the 8 leaves' d(pull) to the embedding
    assert engine.counters.bytes_moved["push"] == 2 * row + 8 * row


def test_known_zero_rows_are_not_computed():
    """Leaves have no children: the leaf task runs no [hl; hr] Uh and sends no child gradients."""
    model = cavs.models.build("tree_lstm", hidden=4, seed=0, dtype="float64")
    engine = cavs.Engine(model, backend=backend_name())
    batch = model.make_batch(["(1 (2 a) (3 (2 b) (2 c)))"])    # 3 tasks: leaves, inner, root
    engine.loss_and_grads(batch)
    # forward: x Wx once (eager, leaf rows only), [hl; hr] Uh in the 2 internal tasks;
    # backward: d[hl; hr] in the 2 internal tasks; d x once (lazy); one dW per parameter
    assert engine.counters.kernels["matmul"] == 1 + 2
    assert engine.counters.kernels["matmul_t"] == 2 + 1
    assert engine.counters.kernels["param_grad"] == 2
    assert engine.counters.kernels["scatter"] == 2 * 2


# ---------------------------------------------------------------- bad input: clear errors

@pytest.mark.parametrize("line,message", MALFORMED_TREES)
def test_malformed_tree_names_the_line(line, message):
    """Through the engine's own entry point (tests/test_graphs.py: the same lines in a batch)."""
    model = cavs.models.build("tree_lstm", hidden=4)
    sample = cavs.readers.SourceLine(line, "train.txt:42")
    with pytest.raises(cavs.InputError, match=f"train.txt:42.*{re.escape(message)}"):
        model.make_batch([sample])


def test_errors_name_sample_and_vertex():
    model = cavs.models.build("tree_fc", hidden=4, leaves=4)
    cyclic = Graph(np.array([[-1, -1], [0, 2], [1, -1]]), np.array([1, -1, -1]), np.array([-1, -1, 0]), "sample 3")
    fine = Graph(np.array([[-1, -1], [-1, -1], [0, 1]]), np.array([1, 2, -1]), np.array([-1, -1, 0]), "sample 2")
    with pytest.raises(cavs.InputError, match="sample 3: the graph has a cycle; vertex 1"):
        make_forest([fine, cyclic], 2)
    out_of_range = Graph(np.array([[-1, -1], [0, 5]]), np.array([1, -1]), np.array([-1, 0]), "sample 0")
    with pytest.raises(cavs.InputError, match="sample 0: vertex 1 child 1 is 5, out of range"):
        make_forest([out_of_range], 2)
    ternary = Graph(np.array([[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2]]),
                    np.array([1, 1, 1, -1]), np.array([-1, -1, -1, 0]), "sample 7")
    with pytest.raises(cavs.InputError, match="sample 7: vertex 3 has 3 children, more than .* arity 2"):
        make_forest([ternary], 2)
    with pytest.raises(cavs.InputError, match="empty batch"):
        model.make_batch([])
    with pytest.raises(cavs.InputError, match="sample 1: token 2 is 99999"):
        cavs.models.build("var_lstm", hidden=4).make_batch([[1, 2, 3], [4, 5, 99999, 6]])


def test_parent_array_reader():
    g = cavs.graphs.from_parent_array([2, 2, -1, 0], name="p")
    assert g.children.tolist() == [[3, -1], [-1, -1], [0, 1], [-1, -1]]
    with pytest.raises(cavs.InputError, match="p: vertex 1 has parent 9"):
        cavs.graphs.from_parent_array([-1, 9], name="p")
    with pytest.raises(cavs.InputError, match="cycle"):
        cavs.graphs.from_parent_array([1, 0, -1], name="p")


def _model_with(cell):
    return cavs.Model(cell, {"W": (8, 4), "b": (4,)}, arity=2, state=4, embedding=(10, 4), classes=5)


def test_trace_errors_name_the_line_and_op():
    def gathers_a_missing_child(v, p):
        v.scatter(v.gather(2))

    def scatters_twice(v, p):
        v.scatter(v.gather(0))
        v.scatter(v.gather(1))

    def never_scatters(v, p):
        v.push(v.gather(0))

    def wrong_shapes(v, p):
        v.scatter(v.gather(0) @ p.W)

    def unknown_param(v, p):
        v.scatter(v.gather(0) @ p.nope)

    with pytest.raises(cavs.TraceError, match=r"test_engine.py:\d+ \(gather\): child index 2 is beyond the declared arity 2"):
        _model_with(gathers_a_missing_child)
    with pytest.raises(cavs.TraceError, match=r"\(scatter\): scatter called twice"):
        _model_with(scatters_twice)
    with pytest.raises(cavs.TraceError, match="scatter was never called"):
        _model_with(never_scatters)
    with pytest.raises(cavs.TraceError, match=r"test_engine.py:\d+ \(matmul\): cannot multiply a vertex vector of width 4"):
        _model_with(wrong_shapes)
    with pytest.raises(cavs.TraceError, match="unknown parameter p.nope"):
        _model_with(unknown_param)


def test_missing_gradient_rule_is_named(monkeypatch):
    from cavs import grad
    monkeypatch.delitem(grad.GRADIENT_RULES, "tanh")
    with pytest.raises(cavs.TraceError, match=r"\(tanh\): no gradient rule for op 'tanh'"):
        cavs.models.build("tree_fc", hidden=4, leaves=4)


@pytest.mark.parametrize("workload", cavs.workloads.WORKLOADS)
def test_models_start_from_the_workloads_initial_values(workload):
    """The model files (cavs.Model with shapes and a forget-bias array) and the baselines'
    cavs.workloads.init_params give the same arrays, in the same order."""
    model = cavs.models.build(workload, hidden=6, seed=4, dtype="float64", leaves=8)
    mine, theirs = model.init_params(), cavs.workloads.init_params(workload, 6, 4, "float64", leaves=8)
    assert list(mine) == list(theirs)
    for name in mine:
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)
