"""The models and batches the CuPy backend is checked on, against the NumPy backend: the real GPU
(test_gpu.py) and the stand-in over NumPy (test_gpu_standin.py) run the same cases.

Every model of cavs.models (the paper's four, the child-sum Tree-LSTM on edges and on child
slots), plus attention over children and a model using every op (test_edges.py's), so that every
expression template of ops.py goes through a fused CUDA kernel and every row op of the backend
(take_rows, add_rows, max_rows, segment_rows) runs. Small float64 batches; the reference is the NumPy backend
unfused, with NumPy's own matmul (no library measurement, no Numba compile but the loss's)."""
from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

import cavs
from cavs.models import child_sum
from tests.engine.helpers import C, E, H, V, dag, nary_trees, random_tree

SWITCHES = ("lazy", "eager", "fusion", "streaming")
# all 16 combinations of the engine's switches
ALL_SWITCHES = [dict(zip(SWITCHES, bits)) for bits in itertools.product((False, True), repeat=4)]
# the corners: everything off, each optimization on alone... rather: off, fusion alone, and all on
CORNERS = [dict.fromkeys(SWITCHES, False), {**dict.fromkeys(SWITCHES, False), "fusion": True},
           {**dict.fromkeys(SWITCHES, False), "fusion": True, "streaming": True}, dict.fromkeys(SWITCHES, True)]
PAPER = ("fixed_lstm", "var_lstm", "tree_fc", "tree_lstm")
EXTRA = ("child_sum_edges", "child_sum_slots", "attention", "every_op")
MODELS = PAPER + EXTRA


def switch_id(options: dict) -> str:
    on = [k for k in SWITCHES if options[k]]
    return "+".join(on) if on else "all-off"


@functools.lru_cache(maxsize=None)
def _paper_samples():
    """A few real samples per workload (short ones), as tests/conftest.py's small_samples."""
    from cavs import datasets
    sst = [s for s in datasets.load_samples("tree_lstm", "train", limit=200) if len(s) < 140][:6]
    var = [s for s in datasets.load_samples("var_lstm", "train", limit=50) if len(s) < 14][:5]
    fixed = [s[:9] for s in datasets.load_samples("fixed_lstm", "train", limit=4)]
    tree_fc = datasets.tree_fc_samples(4, leaves=8, seed=3)
    return {"tree_lstm": sst, "var_lstm": var, "fixed_lstm": fixed, "tree_fc": tree_fc}


def _slot_trees():
    rng = np.random.default_rng(5)
    return [random_tree(rng, 14, "slots a", max_degree=3), random_tree(rng, 9, "slots b", max_degree=3),
            random_tree(rng, 1, "slots single")]


def case(name: str, dtype: str = "float64"):
    """(model, samples or graphs) of one case."""
    if name in PAPER:
        model = cavs.models.build(name, hidden=6, seed=2, dtype=dtype, leaves=8)
        return model, _paper_samples()[name]
    if name == "child_sum_edges":
        return child_sum.model(None, H, E, V, classes=C, seed=1, dtype=dtype), [dag(), *nary_trees(2)]
    if name == "child_sum_slots":
        return child_sum.model(3, H, E, V, classes=C, seed=1, dtype=dtype), _slot_trees()
    from tests.engine import test_edges          # their cells, as the CPU tests run them
    rng = np.random.default_rng(4)
    graphs = [dag(), random_tree(rng, 12, "wide", wide=6), random_tree(rng, 9, "mixed")]
    if name == "attention":
        model = test_edges.attention_model()
    elif name == "every_op":
        model = test_edges.every_op_model()
    else:
        raise KeyError(name)
    if dtype != "float64":
        raise ValueError(f"{name} is built in float64 only")
    return model, graphs


def reference(model, samples):
    """(loss, grads) of the NumPy backend, unfused, NumPy's matmul."""
    engine = cavs.Engine(model, backend="numpy", fusion=False, streaming=False, blas="numpy")
    return engine.loss_and_grads(model.make_batch(samples))


def compare(got, want, rtol: float = 1e-9, gtol: float = 1e-7):
    """Loss to rtol; every gradient to gtol of its largest entry."""
    (loss, grads), (ref_loss, ref_grads) = got, want
    assert np.isfinite(loss) and abs(loss - ref_loss) <= rtol * max(1.0, abs(ref_loss)), (loss, ref_loss)
    assert set(grads) == set(ref_grads)
    for k, g in ref_grads.items():
        scale = max(1e-12, float(np.abs(g).max()))
        err = float(np.abs(np.asarray(grads[k]) - g).max()) / scale
        assert err <= gtol, f"d{k}: relative error {err:.2e} > {gtol}"



def check_segment_rows(be, xp, dtype) -> None:
    """be.segment_rows over rows [a, b) against a loop over each vertex's edges: zeros for degree 0
    (at both ends of the range too), degrees 1 to 37 (six rounds of the CuPy backend's doubling), a
    NaN edge (its maximum is NaN), a strided source, rows outside [a, b) untouched. The maximum is
    exactly one of the edges' values (edge_max's gradient finds the edges equal to it); the sums
    (atomics on a GPU: any order) to a few ulp."""
    from types import SimpleNamespace
    rng = np.random.default_rng(1)
    degree = np.array([2, 0, 1, 5, 0, 3, 37, 4, 2, 0, 6])
    offset = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    parent = np.repeat(np.arange(len(degree)), degree).astype(np.int64)
    wide = rng.standard_normal((len(parent), 13)).astype(dtype)
    wide[offset[5] + 1, 6] = np.nan                      # a NaN edge of vertex 5, column 4 below
    src = wide[:, 2:11]
    edges = SimpleNamespace(offset=offset, parent=be.index(parent), first=be.index(offset))
    a, b = 1, 10
    for op in ("sum", "max"):
        out = xp.asarray(np.full((len(degree), 9), 7.0, dtype))
        be.segment_rows(op, out, (wide if xp is np else xp.asarray(wide))[:, 2:11], edges, a, b)
        got = be.to_numpy(out)
        want = np.full_like(got, 7.0)
        for v in range(a, b):
            edge_rows = src[offset[v]:offset[v + 1]]
            want[v] = 0 if len(edge_rows) == 0 else edge_rows.sum(0) if op == "sum" else edge_rows.max(0)
        if op == "max":
            np.testing.assert_array_equal(got, want, err_msg=op)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-12 if dtype == np.float64 else 1e-5, err_msg=op)
        assert (got[[1, 4, 9]] == 0).all() and (got[[0, 10]] == 7).all()
        assert np.isnan(got[5, 4]) and np.isfinite(np.delete(got[5], 4)).all()


def check_training_steps(name: str) -> None:
    """SGD (clipped) and Adagrad steps, the sparse embedding update and predict's softmax on the
    CuPy backend (fused) equal the NumPy backend's (NumPy's matmul), two steps each."""
    model, samples = case(name)
    batch = model.make_batch(samples)
    for make in (lambda: None, lambda: cavs.optim.Adagrad(lr=0.1, weight_decay=1e-3)):
        engines = [cavs.Engine(model, backend=b, optimizer=make(), fusion=b == "cupy",
                               **({"blas": "numpy"} if b == "numpy" else {})) for b in ("numpy", "cupy")]
        for _ in range(2):
            losses = [e.step(batch) for e in engines]
            assert losses[1] == pytest.approx(losses[0], rel=1e-9)
        for k in engines[0].params:
            np.testing.assert_allclose(engines[1].params[k], engines[0].params[k], rtol=1e-8, atol=1e-10)
        for got, want in zip(engines[1].predict(batch), engines[0].predict(batch)):
            np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12)

# ---------------------------------------------------------------- every expression template, alone

# attributes for the templates that take one (several values where the literal's form differs)
TEMPLATE_ATTRS = {"scale": [{"c": 0.3}, {"c": -2}], "shift": [{"c": -0.7}], "power": [{"p": 2}, {"p": -1.5}],
                  "max_const": [{"c": 0.3}], "min_const": [{"c": -0.2}], "gt_const": [{"c": 0.1}],
                  "lt_const": [{"c": 1e-05}]}
POSITIVE = ("log", "power")          # their input is kept positive


def templates():
    """(id, op, attrs, second operand width 1?) for every elementwise op of ops.py."""
    from cavs.ops import OPS
    out = []
    for op, d in OPS.items():
        if d.expr is None:
            continue
        for attrs in TEMPLATE_ATTRS.get(op, [{}]):
            tag = "-".join(f"{k}={v}" for k, v in attrs.items())
            out.append((f"{op}{'-' + tag if tag else ''}", op, attrs, False))
    out += [("mul-broadcast", "mul", {}, True), ("add-broadcast", "add", {}, True)]
    return out


def template_group(op, attrs, broadcast, width=5):
    """A fused group of one member (op over one or two vertex inputs), written out, and the
    shapes of its inputs."""
    from cavs import fusion
    from cavs.ops import OPS, Node
    binary = "{1}" in OPS[op].expr
    in_width = 1 if op == "expand" else width
    x = Node("pull", (), (in_width,), id=1)
    y = Node("pull", (), (1 if broadcast else width,), id=2)
    member = Node(op, (x, y) if binary else (x,), (width,), dict(attrs), id=10)
    sink = Node("push", (member,), (width,), id=11)
    group = fusion.describe([member], {x: [member], y: [member], member: [sink]})
    return group, [tuple(i.shape) for i in group.inputs]


def template_inputs(op, shapes, rows=7, dtype="float64", seed=0):
    rng = np.random.default_rng(seed)
    values = []
    for k, (w,) in enumerate(shapes):
        v = rng.uniform(0.2, 1.5, (rows, w)) if op in POSITIVE else rng.uniform(-1.5, 1.5, (rows, w))
        if op in ("ge", "eq") and k == 1:        # some ties
            v[::2] = values[0][::2, :w]
        values.append(v.astype(dtype))
    return values


def template_reference(op, attrs, values):
    """The op's NumPy implementation (ops.py's run on the NumPy backend)."""
    from cavs.backend.numpy import NumpyBackend
    from cavs.ops import OPS
    width = max(v.shape[1] for v in values) if op != "expand" else 5
    out = np.empty((values[0].shape[0], width), dtype=values[0].dtype)
    OPS[op].run(NumpyBackend(), out, values, attrs)
    return out
