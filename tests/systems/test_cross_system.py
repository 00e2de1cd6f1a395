"""Every system, from the same initial weights on the same real batch, gives the Cavs engine's loss
(the batch's mean), and after one SGD step with clipping (the spec's threshold, and one low enough
to clip) the same parameters (float64: rel. error <= 1e-6; float32: <= 1e-4). And the child-sum
Tree-LSTM written in DyNet (baselines/dynet_child_sum.py) gives Cavs' losses on n-ary SST trees."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cavs
from baselines import get_system

ROOT = Path(__file__).resolve().parents[2]


# system -> the Python module it needs (skip, with the reason, where it is not installed)
NEEDS = {"pytorch": "torch", "pytorch-levels": "torch", "cudnn": "torch", "fold": "torch", "fold-n": "torch",
         "dynet": "dynet", "dynet-depth": "dynet", "tensorflow": "tensorflow", "cavs-serial": None}


CASES = [(system, workload) for system in NEEDS for workload in cavs.workloads.WORKLOADS]


HIDDEN = 6


@pytest.fixture(params=[None, 0.01], ids=["clip-default", "clip-0.01"])
def clip_norm(request, monkeypatch):
    """The spec's threshold (the engine's default), and one below every gradient norm here, so that
    every system's clipping is compared with the engine's; the systems read workloads.CLIP_NORM."""
    if request.param is not None:
        monkeypatch.setattr(cavs.workloads, "CLIP_NORM", request.param)
    return request.param


def _reference(workload, samples, dtype, clip_norm=None):
    model = cavs.models.build(workload, hidden=HIDDEN, seed=1, dtype=dtype, leaves=8)
    optimizer = None if clip_norm is None else cavs.optim.SGD(lr=cavs.workloads.LEARNING_RATE, clip_norm=clip_norm)
    engine = cavs.Engine(model, optimizer=optimizer)
    batch = model.make_batch(samples)
    loss = engine.step(batch)
    return loss, {k: np.array(v) for k, v in engine.params.items()}


@pytest.mark.parametrize("system,workload", CASES)
def test_same_loss_and_update_as_cavs(system, workload, small_samples, clip_norm):
    module = NEEDS[system]
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    make = get_system(system)
    if workload not in make.system_class.workloads:
        pytest.skip(f"{system} does not implement {workload}")
    dtype = "float64" if make.system_class.supports_float64 else "float32"
    tol = 1e-6 if dtype == "float64" else 1e-4
    samples = small_samples[workload]
    ref_loss, ref_params = _reference(workload, samples, dtype, clip_norm)
    sut = make(workload, hidden=HIDDEN, batch_size=len(samples), dtype=dtype, seed=1, leaves=8)
    loss = sut.step(sut.prepare(samples))
    assert loss == pytest.approx(ref_loss, rel=tol), f"{system} loss {loss} vs cavs {ref_loss}"
    after = sut.get_params()
    for name, want in ref_params.items():
        got = np.asarray(after[name], dtype=np.float64)
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() <= tol * scale, f"{system} parameter {name} differs after one step"


# ---------------------------------------------------------------- the child-sum model in DyNet

@pytest.mark.skipif(importlib.util.find_spec("dynet") is None, reason="dynet is not installed")
def test_dynet_child_sum_gives_the_same_losses_as_cavs():
    """baselines/dynet_child_sum.py's DyNet model (child loop over the actual children) against
    Cavs on the same n-ary SST batch from the same weights, three SGD steps (float32)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "experiments.studies", "nary", "--check", "--trees", "8",
                           "--hidden", "16", "--embed", "8", "--batch-size", "8"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["max_degree"] >= 5
    for step, (a, b) in enumerate(zip(result["cavs"], result["dynet"])):
        assert b == pytest.approx(a, rel=2e-5), f"step {step}: cavs {a}, dynet {b}"


def test_the_ablations_share_tokens_option_reaches_the_engine(small_samples):
    """The ablation's variants pass share_tokens through CavsSystem; either way the same step."""
    samples = small_samples["tree_lstm"]
    make = get_system("cavs")
    losses = {}
    for share in (True, False):
        sut = make("tree_lstm", hidden=HIDDEN, batch_size=len(samples), dtype="float64", seed=1,
                   share_tokens=share)
        assert sut.engine.options["share_tokens"] is share
        losses[share] = sut.step(sut.prepare(samples))
    assert losses[True] == pytest.approx(losses[False], rel=1e-12)
