"""Optimizers (cavs/optim.py): the default rule (SGD, lr 1.0, clipped to a global norm of 5), SGD,
Adagrad and Adam with weight decay and clipping against torch.optim, step by step, and embedding
rows no vertex reads left alone (no weight decay, no optimizer state change)."""
import numpy as np
import pytest

import cavs
from tests.engine.helpers import V, assert_close, child_sum_model, dag, engine_for, random_tree, \
    reference_forward, torch_params

torch = pytest.importorskip("torch")


def test_step_applies_the_default_rule_and_infer_matches_forward(small_samples):
    """docs/workloads.md's rule: SGD, lr 1.0, on the mean loss, gradients clipped to a global norm of 5."""
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


@pytest.mark.parametrize("frozen", [("emb",), ("U",), ("emb", "U")])
def test_frozen_parameters_stay_out_of_the_clipping_norm(frozen):
    """As clip_grad_norm_ over the trainable parameters: a frozen parameter, the embedding
    included, neither moves nor counts in the global norm."""
    graphs = all_rows_batch()
    model = child_sum_model(8)
    engine = cavs.Engine(model, backend="numpy", fusion=False, frozen=frozen,
                         optimizer=cavs.optim.SGD(lr=0.5, clip_norm=0.05))
    batch = model.make_batch(graphs)
    P = torch_params(dict(engine.params))
    for name in frozen:
        P[name].requires_grad_(False)
    trainable = [p for name, p in P.items() if name not in frozen]
    torch_opt = torch.optim.SGD(trainable, lr=0.5)
    for step in range(2):
        loss = engine.step(batch)
        torch_opt.zero_grad()
        ref_loss, _ = reference_forward(graphs, P)
        ref_loss.backward()
        assert float(torch.nn.utils.clip_grad_norm_(trainable, 0.05)) > 0.05
        torch_opt.step()
        assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-9), f"step {step}"
        for name, p in P.items():
            assert_close(engine.params[name], p.detach().numpy(), 1e-9, f"frozen {frozen} step {step}: {name}")


@pytest.mark.parametrize("make, said", [
    (lambda: cavs.optim.SGD(lr="0.1"), r"lr must be a positive number, got '0.1'"),
    (lambda: cavs.optim.SGD(lr=float("nan")), r"lr must be a positive number, got nan"),
    (lambda: cavs.optim.Adagrad(weight_decay=-1e-4), r"weight_decay must be a number >= 0"),
    (lambda: cavs.optim.Adagrad(clip_norm=0), r"clip_norm must be a positive number or None, got 0"),
    (lambda: cavs.optim.Adagrad(eps=-1.0), r"eps must be a number >= 0"),
    (lambda: cavs.optim.Adam(betas=(1.0, 0.999)), r"betas must be two numbers in \[0, 1\)"),
    (lambda: cavs.optim.Adam(betas=0.9), r"betas must be two numbers in \[0, 1\)"),
])
def test_hyperparameters_out_of_their_range_are_refused_naming_them(make, said):
    with pytest.raises(ValueError, match=said):
        make()
