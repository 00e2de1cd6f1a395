"""The engine end to end against plain PyTorch per sample, on real SST/PTB samples: loss and every
gradient, a sample's terms independent of its batch mates and their order, and the switches (lazy
batching, eager batching, streaming, fusion) that change speed, never the numbers."""
import itertools

import numpy as np
import pytest

import cavs
from tests.engine.helpers import assert_close, engine_for, run

torch = pytest.importorskip("torch")
from baselines.pytorch_sample import PytorchSampleSystem  # noqa: E402

SWITCHES = ("lazy", "eager", "fusion", "streaming")


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


@pytest.mark.parametrize("workload", cavs.workloads.WORKLOADS)
def test_every_switch_combination_gives_the_same_numbers(workload, small_samples):
    samples = small_samples[workload]
    (base_loss, base_grads), _ = run(workload, samples, **dict.fromkeys(SWITCHES, False))
    for values in itertools.product([False, True], repeat=len(SWITCHES)):
        options = dict(zip(SWITCHES, values))
        (loss, grads), _ = run(workload, samples, **options)
        # reordering only (lazy, eager, streaming): 1e-9; fusion changes the arithmetic: 1e-6
        tol = 1e-6 if options["fusion"] else 1e-9
        assert loss == pytest.approx(base_loss, rel=tol), options
        for name, g in grads.items():
            err = np.abs(g - base_grads[name]).max() / max(1e-300, np.abs(base_grads[name]).max())
            assert err <= tol, f"{workload} {options}: d/d{name} relative error {err:.1e}"
