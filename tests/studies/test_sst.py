"""SST training to accuracy: the three systems take the same Adagrad steps from the same weights,
and the study runs end to end."""
import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cavs.models.datasets import load_samples
from cavs.models.workloads import init_params
from experiments.studies import sst

ROOT = Path(__file__).resolve().parents[2]
HAVE_DYNET = importlib.util.find_spec("dynet") is not None
needs_dynet = pytest.mark.skipif(not HAVE_DYNET, reason="dynet is not installed")
H, E, BS, STEPS = 150, 300, 5, 4      # the sizes; 20 trees in batches of 5


@pytest.fixture(scope="module")
def trees():
    return list(load_samples("tree_lstm", "train", limit=20))


def _run(name, trees, dtype, **kw):
    t = sst.make_system(name, hidden=H, embed=E, dtype=dtype, lr=0.05, weight_decay=1e-4, seed=0, **kw)
    t.set_params(init_params("tree_lstm", H, 0, dtype, embed=E))
    losses = [t.step(t.prepare(trees[i:i + BS])) for i in range(0, STEPS * BS, BS)]
    return np.array(losses), t


@pytest.fixture(scope="module")
def reference(trees):
    """PyTorch in float64: torch.optim.Adagrad's rule (and DyNet's eps placement, for the DyNet check)."""
    return {rule: _run("pytorch", trees, "float64", eps_rule=rule) for rule in ("torch", "dynet")}


def test_cavs_steps_match_pytorch_float64(trees, reference):
    ref_losses, ref = reference["torch"]
    losses, cavs = _run("cavs", trees, "float64")
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-9)
    assert ref_losses[-1] < ref_losses[0] or not np.allclose(ref_losses, ref_losses[0])   # it trains
    mine, theirs = cavs.get_params(), ref.get_params()
    for name in theirs:
        np.testing.assert_allclose(mine[name], theirs[name], rtol=1e-7, atol=1e-9, err_msg=name)
    dev = list(load_samples("tree_lstm", "dev", limit=7))
    np.testing.assert_allclose(cavs.predict(cavs.prepare(dev)), ref.predict(ref.prepare(dev)), rtol=1e-8, atol=1e-12)


@needs_dynet
def test_dynet_steps_match_pytorch(trees, reference):
    """DyNet computes in float32 only. Its AdagradTrainer divides by sqrt(acc + eps) where torch
    divides by sqrt(acc) + eps: against torch's rule the losses agree to ~1e-4 (the rule differs only
    on gradients below ~1e-9); against the same rule written in PyTorch, to float32 rounding."""
    losses, dynet = _run("dynet", trees, "float32")
    np.testing.assert_allclose(losses, reference["dynet"][0], rtol=2e-5)
    np.testing.assert_allclose(losses, reference["torch"][0], rtol=2e-4)
    dev = list(load_samples("tree_lstm", "dev", limit=7))
    theirs = reference["dynet"][1]
    np.testing.assert_allclose(dynet.predict(dynet.prepare(dev)), theirs.predict(theirs.prepare(dev)), atol=1e-4)


@pytest.mark.parametrize("name", ["cavs", "pytorch", "cavs-torch", pytest.param("dynet", marks=needs_dynet)])
def test_unused_embedding_rows_untouched(name, trees):
    """Rows no tree of a batch looked up get no decay and no update (sparse Adagrad)."""
    dtype = "float32"
    start = init_params("tree_lstm", H, 0, dtype, embed=E)
    _, t = _run(name, trees, dtype)
    from cavs import workloads
    used = {int(v) for g in workloads.to_graphs("tree_lstm", trees[:STEPS * BS]) for v in g.tokens if v >= 0}
    emb = t.get_params()["emb"]
    unused = np.setdiff1d(np.arange(len(emb)), sorted(used))
    np.testing.assert_array_equal(emb[unused], start["emb"][unused])
    assert not np.array_equal(emb[sorted(used)], start["emb"][sorted(used)])


def test_accuracies():
    p = np.array([[.1, .5, .2, .1, .1],     # gold 1: fine right, binary negative (right)
                  [.3, .0, .4, .3, .0],     # gold 3: fine wrong (2), binary P(3,4)=.3 = P(0,1)=.3 -> negative: wrong
                  [.0, .0, .9, .05, .05],   # gold 2: fine right, left out of binary
                  [.0, .1, .2, .3, .4]])    # gold 0: fine wrong, binary wrong
    fine, binary = sst.accuracies(p, np.array([1, 3, 2, 0]))
    assert fine == pytest.approx(0.5) and binary == pytest.approx(1 / 3)


def test_epoch_order_and_slices():
    a, b = sst.epoch_order(100, 0, 1), sst.epoch_order(100, 0, 1)
    assert (a == b).all() and not (a == sst.epoch_order(100, 0, 2)).all()
    assert sorted(a) == list(range(100))
    lines = load_samples("tree_lstm", "dev")
    sub = sst.spread(lines, 50)
    assert len(sub) == 50 and sub[0] == lines[0] and sub[-1] == lines[-1]
    assert {sst.root_label(s) for s in sub} == set(range(5))     # spread over the sorted file
    assert sst.vertex_count(lines[0]) == len(__import__("cavs").workloads.to_graph("tree_lstm", lines[0]).labels)


@pytest.mark.slow
def test_harness_end_to_end(tmp_path):
    """A tiny run of every system through the real subprocess path writes the CSV; the plot step
    after it (as `make sst` runs it) the figure and summary."""
    systems = "cavs,pytorch" + (",dynet" if HAVE_DYNET else "")
    cmd = [sys.executable, "-m", "experiments.studies", "sst", "--profile", "quick", "--systems", systems,
           "--hidden", "8", "--embed", "8", "--train-limit", "30", "--partial-trees", "10", "--epochs", "2",
           "--dev-limit", "12", "--test-limit", "12", "--batch-size", "5", "--eval-batch", "6",
           "--results", str(tmp_path), "--quiet"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-m", "plots.sst", "--results", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    with open(tmp_path / "sst.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert set(sst.COLUMNS) <= set(rows[0])
    by = {}
    for r in rows:
        assert r["status"] == "ok"
        by.setdefault(r["system"], []).append(r)
    assert len(by["cavs"]) == 2 and len(by["pytorch"]) == 1 and by["pytorch"][0]["trees"] == "10"
    for system, rs in by.items():
        best = [r for r in rs if r["best_epoch"] == "1"]
        assert len(best) == 1 and best[0]["test_fine"] != "" and best[0]["test_binary"] != ""
        assert all(0 <= float(r["dev_fine"]) <= 1 and float(r["train_trees_per_s"]) > 0 for r in rs)
        assert [float(r["wall_s"]) for r in rs] == sorted(float(r["wall_s"]) for r in rs)
    # the first epoch's first batches are the same trees from the same weights: equal losses
    if HAVE_DYNET:
        assert float(by["dynet"][0]["train_loss"]) == pytest.approx(float(by["cavs"][0]["train_loss"]), rel=1e-3)
    for name in ("sst.png", "sst.pdf", "sst.md"):
        assert (tmp_path / "figures" / name).stat().st_size > 0
    if HAVE_DYNET:
        assert "faster to it" in (tmp_path / "figures" / "sst.md").read_text()


@pytest.mark.parametrize("dtype,rtol", [("float32", 2e-5), ("float64", 1e-10)])
def test_cavs_through_torch_takes_the_native_engines_steps(trees, dtype, rtol):
    """cavs-torch (the engine as a cavs.torch module, a torch embedding, head and Adagrad) from the
    same weights: the native engine's losses; in float64 its parameters and predictions too (in
    float32, Adagrad's first steps, ~lr * sign(g), amplify the rounding of gradients near 0)."""
    pytest.importorskip("torch")
    native, cavs = _run("cavs", trees, dtype)
    losses, through_torch = _run("cavs-torch", trees, dtype)
    np.testing.assert_allclose(losses, native, rtol=rtol)
    if dtype == "float64":
        mine, theirs = through_torch.get_params(), cavs.get_params()
        for name in theirs:
            np.testing.assert_allclose(mine[name], theirs[name], rtol=1e-7, atol=1e-9, err_msg=name)
        dev = list(load_samples("tree_lstm", "dev", limit=7))
        np.testing.assert_allclose(through_torch.predict(through_torch.prepare(dev)), cavs.predict(cavs.prepare(dev)),
                                   rtol=1e-8, atol=1e-12)
