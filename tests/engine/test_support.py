"""What each op computes per task (cavs/support.py): rows known to be zero are not computed (a leaf's
[hl; hr] Uh, the gradients towards children it does not have); products bounded by a child slot run
on the rows that have that child (support.row_bounds, engine._subset_fn), with the same numbers as
multiplying every row of the task, and are never taken by the paper's four models, whose tasks give
every vertex the same children (so their numbers and speed are those of the full products)."""
from __future__ import annotations

import numpy as np
import pytest

import cavs
from cavs import lowering
from tests.conftest import backend_name
from tests.engine.helpers import assert_close, child_sum_model, dag, nary_trees, sst_trees

SUBSET_KERNELS = ("matmul-rows", "matmul_t-rows", "param_grad-rows", "bias_grad-rows")


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


def child_sum_run(graphs, share, monkeypatch, policy="batched"):
    monkeypatch.setattr(lowering, "SUBSET_MAX_SHARE", share)
    model = child_sum_model(32)
    engine = cavs.Engine(model, backend="numpy", policy=policy, fusion=False)
    loss, grads = engine.loss_and_grads(model.make_batch(graphs))
    return loss, grads, engine.counters.kernels


@pytest.mark.parametrize("policy", ["batched", "alap"])
def test_row_subsets_equal_full_products(policy, monkeypatch):
    graphs = nary_trees() + [dag()] + sst_trees(3)
    full_loss, full_grads, full_kernels = child_sum_run(graphs, -1.0, monkeypatch, policy)
    loss, grads, kernels = child_sum_run(graphs, 0.8, monkeypatch, policy)
    assert not any(full_kernels[k] for k in SUBSET_KERNELS)
    for k in ("matmul-rows", "matmul_t-rows", "param_grad-rows"):     # h_k Uf, its gradients
        assert kernels[k] > 0, k
    assert loss == pytest.approx(full_loss, rel=1e-13)
    for name in full_grads:
        assert_close(grads[name], full_grads[name], 1e-12, f"{policy}: d loss/d {name}")


@pytest.mark.parametrize("workload", ["tree_lstm", "tree_fc", "var_lstm", "fixed_lstm"])
@pytest.mark.parametrize("policy", ["batched", "serial"])
def test_paper_models_multiply_whole_tasks(workload, policy):
    model = cavs.models.build(workload, hidden=4, seed=0, dtype="float64", leaves=8)
    samples = cavs.datasets.load_samples(workload, "train", limit=16, leaves=8)
    engine = cavs.Engine(model, backend="numpy", policy=policy, fusion=False)
    engine.loss_and_grads(model.make_batch(samples))
    assert not any(engine.counters.kernels[k] for k in SUBSET_KERNELS)
    assert engine.counters.kernels["matmul"] > 0


def test_leaves_in_an_inner_task_skip_the_state_product(monkeypatch):
    """`alap` puts SST's leaves into tasks with inner vertices: the state product [hl; hr] Uh (an
    affine sum's term) and its weight gradient run on the inner vertices' rows alone."""
    model = cavs.models.build("tree_lstm", hidden=4, seed=0, dtype="float64")
    samples = cavs.datasets.load_samples("tree_lstm", "train", limit=8)
    results = {}
    for share in (-1.0, 0.8):
        monkeypatch.setattr(lowering, "SUBSET_MAX_SHARE", share)
        engine = cavs.Engine(model, backend="numpy", policy="alap")
        results[share] = (*engine.loss_and_grads(model.make_batch(samples)), engine.counters.kernels.copy())
    (full_loss, full_grads, full_kernels), (loss, grads, kernels) = results[-1.0], results[0.8]
    assert kernels["matmul-rows"] > 0 and kernels["param_grad-rows"] > 0
    assert not any(full_kernels[k] for k in SUBSET_KERNELS)
    assert loss == pytest.approx(full_loss, rel=1e-13)
    for name in full_grads:
        assert_close(grads[name], full_grads[name], 1e-12, f"alap: d loss/d {name}")


@pytest.mark.parametrize("workload", ["tree_lstm", "var_lstm", "slots", "edges"])
def test_actions_per_signature_equal_the_walk_per_task(workload):
    """support.actions walks F and dF once per distinct task signature (and, with a cache, once per
    signature ever seen): the same actions as walking them over every task."""
    import numpy as np
    from cavs import support
    if workload in ("slots", "edges"):
        model = child_sum_model(32 if workload == "slots" else None)
        batch = model.make_batch(nary_trees() + [dag()])
    else:
        model = cavs.models.build(workload, hidden=4)
        batch = model.make_batch(cavs.datasets.load_samples(workload, limit=12))
    F, dF = model.F, model.dF
    for policy in ("batched", "alap", "serial"):
        sched = batch.schedule(policy)
        slots = support.gathered_slots(F, dF)
        for mode, pull_all in (("train", False), ("predict", False), ("boundary", True)):
            signals = support.task_signals(sched, slots, pull_all)
            walk = support._actions_of(F, dF, signals, dict(zip(slots, signals[3:])), mode)
            cache = {}
            for act in (support.actions(F, dF, sched, mode, pull_all),
                        support.actions(F, dF, sched, mode, pull_all, cache=cache),
                        support.actions(F, dF, sched, mode, pull_all, cache=cache)):     # read back
                assert act.keys() == walk.keys()
                for n in walk:
                    np.testing.assert_array_equal(act[n], walk[n], err_msg=f"{workload} {policy} {mode} {n.op}")
            assert len(cache) == 1 + len(np.unique(signals, axis=1).T)     # the nodes, one column per signature


@pytest.mark.parametrize("signals", [3, 35, 70])
def test_distinct_columns_matches_numpy_unique(signals):
    """The task signatures' packed unique gives the same classes as np.unique over columns (the
    fallback above 62 signals included)."""
    from cavs.support import _distinct_columns
    rng = np.random.default_rng(signals)
    sig = rng.random((signals, 40)) < 0.5
    sig[:, 20:] = sig[:, :20]                     # every column repeated once
    kinds, inverse = _distinct_columns(sig)
    expected, _ = np.unique(sig, axis=1, return_inverse=True)
    assert kinds.shape == expected.shape
    assert (kinds[:, inverse] == sig).all()
    assert {c.tobytes() for c in kinds.T} == {c.tobytes() for c in expected.T}
