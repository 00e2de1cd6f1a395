"""cavs.torch: an engine as a torch.nn.Module. The child-sum Tree-LSTM without a head (classes=None),
a torch head (MSE on the roots) and a torch nn.Embedding feeding pull() through `inputs`, against
the same network written per graph in PyTorch float64 (gradients to 1e-7 relative, the embedding's
too); gradcheck; frozen parameters; train/eval and dropout; the memory the module shares with the
engine through load_state_dict, .to() and assignments; non-finite values; torch.optim, schedulers
and clip_grad_norm_ as PyTorch users write them."""
from __future__ import annotations

import io

import numpy as np
import pytest

import cavs
from cavs import tanh
from cavs.models import child_sum
from tests.engine import helpers
from tests.engine.helpers import E, H, V, assert_close, dag, nary_trees

torch = pytest.importorskip("torch")
import cavs.torch  # noqa: E402

F64 = torch.float64


def unlabelled(graphs):
    """A model without a head takes no labels: the loss is the caller's."""
    return [cavs.Graph(g.children, g.tokens, np.full_like(g.labels, -1), g.name) for g in graphs]


def graphs():
    return unlabelled([dag(), *nary_trees(3)])


def encoder(**options):
    return child_sum.model(None, H, E, V, classes=None, **{"seed": 1, "dtype": "float64", **options})


def module(**options):
    return cavs.torch.VertexModule(encoder(), fusion=False, **options)


def lookup(embedding, batch):
    """Each vertex's row of `embedding` (zeros where it has no token): the `inputs` of a batch."""
    tokens = torch.as_tensor(batch.forest.tokens)
    has = tokens >= 0
    x = torch.zeros(batch.num_vertices, embedding.embedding_dim, dtype=embedding.weight.dtype)
    x[has] = embedding(tokens[has])
    return x


# ---------------------------------------------------------------- the reference, per graph

def child_sum_states(gs, P, rows):
    """Every vertex's h, graph after graph (the batch's row order); `rows(g, v)` is its input."""
    return torch.cat([helpers.child_sum_states(g, P, rows) for g in gs])


def copy(t):
    return t.detach().clone().requires_grad_()


def test_gradients_through_a_torch_head_and_embedding_equal_pytorch():
    gs = graphs()
    enc = module()
    batch = enc.model.make_batch(gs)
    torch.manual_seed(0)
    embedding, head = torch.nn.Embedding(V, E, dtype=F64), torch.nn.Linear(H, 1, dtype=F64)
    y = torch.randn(len(batch.roots), dtype=F64)
    out = enc(batch, inputs=lookup(embedding, batch))
    assert out.shape == (batch.num_vertices, H) and out.dtype == F64
    loss = torch.nn.functional.mse_loss(head(out[batch.roots]).squeeze(1), y)
    loss.backward()

    P = {k: copy(p) for k, p in enc.named_parameters() if k != "emb"}
    table, w, b = copy(embedding.weight), copy(head.weight), copy(head.bias)
    zero = torch.zeros(E, dtype=F64)
    h = child_sum_states(gs, P, lambda g, v: table[int(g.tokens[v])] if g.tokens[v] >= 0 else zero)
    ref = torch.nn.functional.mse_loss((h[batch.roots] @ w.T + b).squeeze(1), y)
    ref.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-9)
    for k, p in P.items():
        assert_close(getattr(enc, k).grad.numpy(), p.grad.numpy(), 1e-7, f"d{k}")
    assert_close(embedding.weight.grad.numpy(), table.grad.numpy(), 1e-7, "d embedding")
    assert_close(head.weight.grad.numpy(), w.grad.numpy(), 1e-7, "d head")
    assert enc.emb.grad is None          # the engine's own table was not read: `inputs` replaced it


@pytest.mark.parametrize("sparse", [False, True])
def test_the_engines_own_embedding_gets_its_gradient(sparse):
    gs = graphs()
    enc = module(sparse=sparse)
    batch = enc.model.make_batch(gs)
    out = enc(batch)
    (out[batch.roots] ** 2).sum().backward()
    P = {k: copy(p) for k, p in enc.named_parameters()}
    h = child_sum_states(gs, P, helpers.embedded(P))
    (h[batch.roots] ** 2).sum().backward()
    got = enc.emb.grad
    assert got.is_sparse is sparse
    assert_close(got.to_dense().numpy(), P["emb"].grad.numpy(), 1e-7, "d emb")
    if sparse:                           # the rows some vertex read, once each
        assert got._indices()[0].tolist() == sorted({int(t) for t in batch.forest.tokens if t >= 0})
    opt = torch.optim.SGD(enc.parameters(), lr=0.1)
    before = enc.engine.params["emb"].copy()
    opt.step()                           # dense or sparse, torch's update is the engine's table
    assert not np.array_equal(before, enc.engine.params["emb"])


def test_gradcheck():
    tiny = child_sum.model(None, 2, 2, 4, classes=None, seed=2, dtype="float64")
    enc = cavs.torch.VertexModule(tiny, fusion=False)
    batch = tiny.make_batch([cavs.Graph.from_children([[], [], [0, 1]], tokens=[1, 3, -1], name="a"),
                             cavs.Graph.from_children([[], [0]], tokens=[2, 0], name="b")])
    x = torch.randn(batch.num_vertices, 2, dtype=F64, requires_grad=True)
    params = [p for k, p in enc.named_parameters() if k != "emb"]
    assert torch.autograd.gradcheck(lambda x, *ps: enc(batch, inputs=x), (x, *params))
    assert torch.autograd.gradcheck(lambda *ps: enc(batch), tuple(enc.parameters()))


def test_frozen_parameters_get_no_gradient_and_do_not_move():
    enc = module(frozen=("U",))
    assert not enc.U.requires_grad and enc.W.requires_grad
    enc.Wf.requires_grad_(False)                   # or later, as in PyTorch
    batch = enc.model.make_batch(graphs())
    frozen = {k: enc.engine.params[k].copy() for k in ("U", "Wf")}
    opt = torch.optim.Adam(enc.parameters(), lr=0.1, weight_decay=0.1)
    for _ in range(2):
        opt.zero_grad()
        enc(batch)[batch.roots].sum().backward()
        assert enc.U.grad is None and enc.Wf.grad is None and enc.W.grad is not None
        opt.step()
    for k, value in frozen.items():
        np.testing.assert_array_equal(enc.engine.params[k], value)
    assert not np.array_equal(enc.engine.params["W"], encoder().init_params()["W"])


def dropout_cell(v, p):
    h = tanh(cavs.dropout(v.pull() @ p.W, 0.5) + v.children().state.sum() @ p.U + p.b)
    v.scatter(h)
    v.push(h)


def test_train_and_eval_switch_dropout_and_an_older_pass_is_recomputed_with_its_masks():
    model = cavs.Model(dropout_cell, {"W": (E, H), "U": (H, H), "b": (H,)}, state=H, embedding=(V, E),
                       classes=None, dtype="float64", seed=4)
    enc = cavs.torch.VertexModule(model, fusion=False)
    batch = model.make_batch(graphs())
    a, b = enc(batch), enc(batch)
    assert enc.training and not torch.equal(a, b)
    enc.eval()
    with torch.no_grad():
        c, d = enc(batch), enc(batch)
    assert torch.equal(c, d)
    np.testing.assert_array_equal(c.numpy(), enc.engine.forward(batch, train=False))
    enc.train()
    params = list(enc.parameters())
    out = enc(batch)
    loss = (out ** 2).sum()
    direct = torch.autograd.grad(loss, params, retain_graph=True)
    enc(batch)                                     # another pass overwrites the engine's activations
    again = torch.autograd.grad(loss, params)      # ... so this backward runs `out`'s pass again
    for g, h in zip(direct, again):
        torch.testing.assert_close(g, h, rtol=1e-12, atol=0)


def test_outputs_and_gradients_are_the_callers_not_engine_buffers():
    enc = module()
    first, second = (enc.model.make_batch(gs) for gs in (graphs(), unlabelled(nary_trees(5))))
    out = enc(first)
    kept = out.detach().clone()
    out.sum().backward()
    grads = {k: p.grad.clone() for k, p in enc.named_parameters()}
    enc(second).sum().backward()                   # the engine's accumulators are zeroed and refilled
    assert torch.equal(out, kept)
    for k, p in enc.named_parameters():            # autograd added the second pass's to the first's
        assert not torch.equal(p.grad, grads[k]), k


def test_parameters_share_the_engines_memory_through_load_to_and_assignment():
    enc = module()
    for k, p in enc.named_parameters():
        assert p.data_ptr() == enc.engine._params[k].ctypes.data, k
    state = {k: torch.randn_like(v) for k, v in enc.state_dict().items()}
    enc.load_state_dict(state)                     # copied in place: still shared
    np.testing.assert_array_equal(enc.engine.params["W"], state["W"].numpy())
    assert enc.W.data_ptr() == enc.engine._params["W"].ctypes.data
    enc.load_state_dict({k: v + 1 for k, v in state.items()}, assign=True)   # new memory: the engine follows
    batch = enc.model.make_batch(graphs())
    enc(batch)
    np.testing.assert_array_equal(enc.engine.params["U"], (state["U"] + 1).numpy())
    enc.engine.params["b"] = np.full(3 * H, 0.5)   # the engine's side: the parameter follows
    out = enc(batch)
    assert torch.equal(enc.b, torch.full((3 * H,), 0.5, dtype=F64))
    with torch.no_grad():
        enc.W.data = torch.zeros_like(enc.W)       # an assignment a user might write
    assert not torch.equal(enc(batch), out)
    assert enc.to(F64) is enc and enc.cpu() is enc and enc.double() is enc
    for convert in (lambda m: m.float(), lambda m: m.to(torch.float16)):
        with pytest.raises(TypeError, match=r"parameter emb is the engine's torch.float64 array on cpu, which cannot "
                                            r"become torch.float(32|16) on cpu"):
            convert(enc)
    assert enc.W.dtype == F64                      # refused before anything changed


def test_state_dict_round_trip_and_torch_save():
    enc = module()
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    buf = io.BytesIO()
    torch.save(enc.state_dict(), buf)
    buf.seek(0)
    other = cavs.torch.VertexModule(child_sum.model(None, H, E, V, classes=None, seed=9, dtype="float64"),
                                    fusion=False)
    other.load_state_dict(torch.load(buf))
    batch = enc.model.make_batch(graphs())
    torch.testing.assert_close(other(batch), enc(batch), rtol=0, atol=0)
    for k in enc.engine.params:
        np.testing.assert_array_equal(other.engine.params[k], enc.engine.params[k])
    with pytest.raises(TypeError, match=r"does not pickle: save module.state_dict\(\)"):
        torch.save(enc, io.BytesIO())


def test_non_finite_inputs_and_gradients_are_refused_clearly():
    enc = module()
    batch = enc.model.make_batch(graphs())
    x = torch.zeros(batch.num_vertices, E, dtype=F64)
    x[batch.graph_slices[2].start + 1, 2] = float("nan")
    name = batch.graphs[2].name
    with pytest.raises(ValueError, match=rf"inputs: {name}: vertex 1 \(row \d+\) has a non-finite value"):
        enc(batch, inputs=x)
    before = {k: v.copy() for k, v in enc.engine.params.items()}
    out = enc(batch)
    with pytest.raises(cavs.NonFiniteError, match="gradient reaching the module's outputs is not finite"):
        (out * float("inf")).sum().backward()
    assert all(p.grad is None for p in enc.parameters())
    for k, v in before.items():
        np.testing.assert_array_equal(enc.engine.params[k], v)


def test_inputs_of_another_dtype_are_cast_and_get_their_gradient_in_it_and_other_devices_are_refused():
    enc = module()                     # float64
    batch = enc.model.make_batch(graphs())
    x = torch.randn(batch.num_vertices, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for dtype in (torch.bfloat16, torch.float32):      # bfloat16: what torch.autocast hands on
        low = x.to(dtype).requires_grad_()
        want = copy(low.detach().to(F64))
        (enc(batch, inputs=low) ** 2).sum().backward()
        (enc(batch, inputs=want) ** 2).sum().backward()
        assert low.grad.dtype == dtype
        torch.testing.assert_close(low.grad, want.grad.to(dtype))
    with pytest.raises(ValueError, match=r"inputs is a tensor on meta; this engine computes on the CPU \(NumPy\)"):
        enc(batch, inputs=torch.zeros(batch.num_vertices, E, device="meta"))
    with pytest.raises(ValueError, match="inputs must be a real tensor"):
        enc(batch, inputs=torch.zeros(batch.num_vertices, E, dtype=torch.complex64))


def test_options_of_the_wrong_kind_are_refused():
    with pytest.raises(TypeError, match="sparse must be True or False, got 'yes'"):
        cavs.torch.VertexModule(encoder(), sparse="yes")
    with pytest.raises(TypeError, match="the engine takes a cavs.Model"):
        cavs.torch.VertexModule(lambda v, p: None)


def test_torch_func_transforms_are_refused_by_name():
    enc = module()
    batch = enc.model.make_batch(graphs())
    x = torch.zeros(batch.num_vertices, E, dtype=F64)
    with pytest.raises(RuntimeError, match="does not run under torch.func transforms"):
        torch.func.grad(lambda t: enc(batch, inputs=t).sum())(x)
    g, = torch.autograd.grad(enc(batch, inputs=copy(x)).sum(), [enc.W])      # what to use instead
    assert g.shape == enc.W.shape


def test_numpy_inputs_a_torch_training_loop_and_a_scheduler():
    enc = module()
    batch = enc.model.make_batch(graphs())
    x = np.random.default_rng(0).normal(size=(batch.num_vertices, E))
    torch.testing.assert_close(enc(batch, inputs=x), enc(batch, inputs=torch.as_tensor(x)), rtol=0, atol=0)
    torch.manual_seed(0)               # the head's start: not whatever earlier tests left torch's generator at
    head = torch.nn.Linear(H, 1, dtype=F64)
    params = [*enc.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    y = torch.linspace(-0.5, 0.5, len(batch.roots), dtype=F64)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(head(enc(batch)[batch.roots]).squeeze(1), y)
        loss.backward()
        assert float(torch.nn.utils.clip_grad_norm_(params, 1.0)) > 0
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 / 8)
