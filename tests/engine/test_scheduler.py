"""Batching policies (cavs/scheduler.py): every policy (scheduler.POLICIES) gives the default policy's
numbers, the same loss and gradients in float64 on the four models, real batches, a DAG and the
child-sum model on n-ary trees; serial gives the batched numbers; and every schedule keeps each
child in a task before its parents'."""
import numpy as np
import pytest

import cavs
from cavs.scheduler import MERGE_MIN_ROWS, POLICIES, alap_levels, merged_levels, schedule
from tests.conftest import backend_name
from tests.engine.helpers import assert_close, dag, dag_batch, engine_for, nary_trees, sst_trees

OTHERS = [p for p in POLICIES if p != "batched"]


def run(workload, batch_of, policy):
    model = cavs.models.build(workload, hidden=6, seed=4, dtype="float64", leaves=8)
    engine = cavs.Engine(model, backend=backend_name(), policy=policy)
    batch = batch_of(model)
    assert batch.schedule(policy).respects_dependencies()
    return engine.loss_and_grads(batch)


def assert_same(a, b, what, tol=1e-10):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert loss_b == pytest.approx(loss_a, rel=tol), what
    assert grads_a.keys() == grads_b.keys()
    for name, g in grads_a.items():
        err = np.abs(grads_b[name] - g).max() / max(1e-300, np.abs(g).max())
        assert err <= tol, f"{what}: d/d{name} relative error {err:.1e}"


@pytest.fixture(scope="module")
def larger_samples():
    """Batches with frontiers of very different sizes (where alap and merged move vertices)."""
    return {"tree_lstm": cavs.datasets.load_samples("tree_lstm", "train", limit=24),
            "var_lstm": cavs.datasets.load_samples("var_lstm", "train", limit=24)}


@pytest.mark.parametrize("policy", OTHERS)
@pytest.mark.parametrize("workload", cavs.workloads.WORKLOADS)
def test_policy_gives_the_default_numbers(workload, policy, small_samples, larger_samples):
    cases = {"small": small_samples[workload]}
    if workload in larger_samples:
        cases["larger"] = larger_samples[workload]
    for size, samples in cases.items():
        make = lambda model: model.make_batch(samples)        # noqa: E731
        assert_same(run(workload, make, "batched"), run(workload, make, policy), f"{workload} {size} {policy}")


@pytest.mark.parametrize("policy", OTHERS)
def test_policy_on_a_dag(policy):
    assert_same(run("tree_lstm", dag_batch, "batched"), run("tree_lstm", dag_batch, policy), f"dag {policy}")


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


def sst_forest(count=64):
    model = cavs.models.build("tree_lstm", hidden=4)
    return model.make_batch(cavs.datasets.load_samples("tree_lstm", "train", limit=count)).forest


def test_alap_puts_every_root_last_and_each_vertex_below_its_parents():
    forest = sst_forest()
    late = alap_levels(forest)
    last = forest.level.max()
    roots = forest.offsets[1:] - 1                       # post-order: each tree's root is its last vertex
    assert (late[roots] == last).all()
    assert (late >= forest.level).all()
    parent, k = np.nonzero(forest.children >= 0)
    assert (late[forest.children[parent, k]] == late[parent] - 1).any()
    assert (late[forest.children[parent, k]] < late[parent]).all()


def test_merged_fills_small_tasks_without_adding_any():
    forest = sst_forest()
    asap, merged = forest.level, merged_levels(forest)
    assert merged.max() == asap.max()                    # the same number of tasks: the longest path
    assert (merged >= asap).all()
    assert (merged[~(forest.children >= 0).any(axis=1)] == 0).all()     # leaves stay in the first task
    small = lambda lv: np.sum(np.bincount(lv) < MERGE_MIN_ROWS)        # noqa: E731
    assert small(merged) < small(asap)
    for policy in POLICIES:
        sched = schedule(forest, policy)
        assert sched.respects_dependencies(), policy
        assert sorted(sched.order.tolist()) == list(range(forest.num_vertices)), policy


def test_policies_agree_on_complete_trees():
    """Tree-FC's complete binary trees of one height leave no vertex a choice of level."""
    model = cavs.models.build("tree_fc", hidden=4, leaves=8)
    forest = model.make_batch(cavs.datasets.tree_fc_samples(5, leaves=8, seed=1)).forest
    base = schedule(forest, "batched")
    for policy in ("alap", "merged"):
        sched = schedule(forest, policy)
        assert np.array_equal(sched.order, base.order) and np.array_equal(sched.bounds, base.bounds), policy


def test_a_schedule_that_breaks_a_dependency_is_caught():
    sched = schedule(sst_forest(4), "batched")
    sched.bounds = np.array([0, sched.num_rows])         # everything in one task
    assert not sched.respects_dependencies()


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="merged"):
        schedule(sst_forest(2), "nope")
