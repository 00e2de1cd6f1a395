"""DyNet-autobatch, TensorFlow-unroll and the PyTorch baselines against an independent float64 reference.

The reference below is docs/workloads.md read literally (zeros for absent inputs, one vertex at a
time, PyTorch autograd for the gradient), sharing nothing with the systems but the data readers
and the initial weights.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from baselines import get_system
from cavs import datasets, workloads
from cavs.graphs import InputError, levels

torch = pytest.importorskip("torch")
HAS = {m: importlib.util.find_spec(m) is not None for m in ("dynet", "tensorflow")}
needs_dynet = pytest.mark.skipif(not HAS["dynet"], reason="dynet is not installed")
needs_tf = pytest.mark.skipif(not HAS["tensorflow"], reason="tensorflow is not installed")
HIDDEN, SEED, LEAVES = 5, 2, 4


def reference_step(workload, samples):
    """Mean loss and parameters after one SGD step (docs/workloads.md's rule: mean loss, gradients
    clipped to a global L2 norm of workloads.CLIP_NORM as torch's clip_grad_norm_ does, lr 1.0),
    float64, vertex by vertex; the embedding's gradient is dense."""
    init = workloads.init_params(workload, HIDDEN, SEED, "float64", LEAVES)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    h, e = HIDDEN, p["emb"].shape[1]
    zero = torch.zeros(h, dtype=torch.float64)
    loss, terms = 0.0, 0
    for i, sample in enumerate(samples):
        g = workloads.to_graph(workload, sample, i)
        hs, cs = {}, {}
        for v in np.argsort(levels(g.children), kind="stable"):
            x = p["emb"][g.tokens[v]] if g.tokens[v] >= 0 else torch.zeros(e, dtype=torch.float64)
            kh = [hs[k] if k >= 0 else zero for k in g.children[v]]
            kc = [cs.get(k, zero) for k in g.children[v]]   # tree_fc has no cell state
            if workload == "tree_fc":
                hs[v] = torch.tanh(torch.cat(kh) @ p["W"] + x + p["b"])
            elif workload == "tree_lstm":
                gi, gl, gr, go, gu = (x @ p["Wx"] + torch.cat(kh) @ p["Uh"] + p["b"]).split(h)
                cs[v] = (torch.sigmoid(gi) * torch.tanh(gu) + torch.sigmoid(gl) * kc[0]
                         + torch.sigmoid(gr) * kc[1])
                hs[v] = torch.sigmoid(go) * torch.tanh(cs[v])
            else:
                gi, gf, go, gu = (x @ p["Wx"] + kh[0] @ p["Wh"] + p["b"]).split(h)
                cs[v] = torch.sigmoid(gi) * torch.tanh(gu) + torch.sigmoid(gf) * kc[0]
                hs[v] = torch.sigmoid(go) * torch.tanh(cs[v])
            if g.labels[v] >= 0:
                loss = loss - torch.log_softmax(hs[v] @ p["Wout"] + p["bout"], 0)[g.labels[v]]
                terms += 1
    loss = loss / terms
    loss.backward()
    norm = torch.sqrt(sum((t.grad ** 2).sum() for t in p.values())).item()
    scale = min(1.0, workloads.CLIP_NORM / (norm + 1e-6))
    return loss.item(), {k: (t - workloads.LEARNING_RATE * scale * t.grad).detach().numpy() for k, t in p.items()}


@pytest.fixture(scope="module")
def samples():
    sst = [s for s in datasets.load_samples("tree_lstm", limit=100) if len(s) < 120][:4]
    var = [s for s in datasets.load_samples("var_lstm", limit=40) if len(s) < 12][:4]
    assert len({len(s) for s in var}) > 1, "the var_lstm batch must mix lengths"
    return {"tree_lstm": sst, "var_lstm": var,
            "fixed_lstm": [s[:7] for s in datasets.load_samples("fixed_lstm", limit=3)],
            "tree_fc": datasets.tree_fc_samples(3, leaves=LEAVES, seed=5)}


def run_system(name, workload, batch, **kw):
    make = get_system(name)
    dtype = "float64" if make.system_class.supports_float64 else "float32"
    sut = make(workload, hidden=HIDDEN, batch_size=len(batch), dtype=dtype, seed=SEED, leaves=LEAVES, **kw)
    return sut, sut.step(sut.prepare(batch)), dtype


def assert_matches_reference(name, workload, batch):
    want_loss, want = reference_step(workload, batch)
    sut, loss, dtype = run_system(name, workload, batch)
    tol = 1e-6 if dtype == "float64" else 1e-4
    assert loss == pytest.approx(want_loss, rel=tol)
    got = sut.get_params()
    for k, w in want.items():
        assert got[k].shape == w.shape, k
        np.testing.assert_allclose(got[k], w, rtol=0, atol=tol * max(1.0, np.abs(w).max()), err_msg=k)


@pytest.fixture(params=["clip-5", "clip-0.01"])
def clip_norm(request, monkeypatch):
    """The spec's threshold, and one far below every gradient norm here, so clipping is checked too."""
    value = float(request.param.split("-")[1])
    monkeypatch.setattr(workloads, "CLIP_NORM", value)
    return value


@needs_dynet
@pytest.mark.parametrize("workload", workloads.WORKLOADS)
def test_dynet_matches_reference(workload, samples, clip_norm):
    assert_matches_reference("dynet", workload, samples[workload])


@needs_dynet
@pytest.mark.parametrize("workload", ["tree_lstm", "var_lstm"])
def test_dynet_depth_strategy_in_the_same_process(workload, samples):
    """dynet then dynet-depth in one process: each step runs with its own strategy."""
    _, agenda, _ = run_system("dynet", workload, samples[workload])
    _, depth, _ = run_system("dynet-depth", workload, samples[workload])
    from baselines import dynet_autobatch
    assert dynet_autobatch._state["flag"].value == 2       # the global DyNet's forward reads
    assert depth == pytest.approx(agenda, rel=1e-5)


@needs_dynet
def test_dynet_depth_alone_in_a_fresh_process(samples):
    """The benchmark's way: a process whose first DyNet system asks for depth-based batching."""
    want, _ = reference_step("tree_fc", samples["tree_fc"])
    code = ("import sys; from baselines import get_system; from cavs import datasets\n"
            f"s = get_system('dynet-depth')('tree_fc', hidden={HIDDEN}, batch_size=3, seed={SEED}, leaves={LEAVES})\n"
            f"print(s.step(s.prepare(datasets.tree_fc_samples(3, leaves={LEAVES}, seed=5))))\n"
            "import dynet_config; assert dynet_config.get()['autobatch'] == 2")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.split()[-1]) == pytest.approx(want, rel=1e-4)


TORCH_CASES = [("pytorch", w) for w in workloads.WORKLOADS] + [("cudnn", "fixed_lstm"), ("cudnn", "var_lstm"),
               ("fold", "tree_fc"), ("fold", "tree_lstm"), ("pytorch-levels", "tree_fc"),
               ("pytorch-levels", "tree_lstm")]


@pytest.mark.parametrize("name,workload", TORCH_CASES)
def test_torch_systems_match_reference(name, workload, samples, clip_norm):
    """The PyTorch systems' row-wise embedding update and clipping against the dense reference."""
    assert_matches_reference(name, workload, samples[workload])


@needs_tf
@pytest.mark.parametrize("workload", ["fixed_lstm", "var_lstm"])
def test_tensorflow_matches_reference(workload, samples, clip_norm):
    assert_matches_reference("tensorflow", workload, samples[workload])


@needs_tf
def test_tensorflow_var_lstm_padding_changes_nothing(samples):
    """A mixed-length batch, padded and masked, gives the token-weighted mean of the samples' own
    losses, and a new maximum length reuses the traced function."""
    batch = samples["var_lstm"]
    sut = get_system("tensorflow")("var_lstm", hidden=HIDDEN, batch_size=len(batch), mode="infer",
                                   dtype="float64", seed=SEED)
    alone = sum(sut.step(sut.prepare([s])) * (len(s) - 1) for s in batch) / sum(len(s) - 1 for s in batch)
    assert sut.step(sut.prepare(batch)) == pytest.approx(alone, rel=1e-10)
    assert sut.timings.extra["traces"] == 1


BAD_INPUT = [("dynet", "tree_lstm", [], "empty batch"),
             ("dynet", "tree_lstm", ["(3 (2 good) (4 movie)"], "unbalanced brackets"),
             ("dynet", "var_lstm", [(5, 6, 10 ** 6)], "outside the vocabulary"),
             ("tensorflow", "var_lstm", [], "empty batch"),
             ("tensorflow", "var_lstm", [(5, 6, -3)], "outside the vocabulary"),
             ("tensorflow", "fixed_lstm", [(1, 2, 3), (1, 2)], "equal lengths")]


@pytest.mark.parametrize("name,workload,batch,message", BAD_INPUT)
def test_bad_input_raises_input_error(name, workload, batch, message):
    if not HAS[name]:
        pytest.skip(f"{name} is not installed")
    sut = get_system(name)(workload, hidden=HIDDEN, batch_size=1, seed=SEED)
    with pytest.raises(InputError, match=message):
        sut.prepare(batch)


def test_dynet_refuses_float64():
    if not HAS["dynet"]:
        pytest.skip("dynet is not installed")
    with pytest.raises(ValueError, match="float32"):
        get_system("dynet")("tree_fc", hidden=HIDDEN, batch_size=1, dtype="float64", leaves=LEAVES)
