import os
from pathlib import Path

import pytest

from cavs import datasets

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly where CuPy or a CUDA device is missing."""
    from cavs.backend import gpu_available
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU with CuPy on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def small_samples():
    """A few real samples per workload (short ones, to keep float64 checks fast)."""
    sst = [s for s in datasets.load_samples("tree_lstm", "train", limit=200) if len(s) < 140][:6]
    var = [s for s in datasets.load_samples("var_lstm", "train", limit=50) if len(s) < 14][:5]
    fixed = [s[:9] for s in datasets.load_samples("fixed_lstm", "train", limit=4)]
    tree_fc = datasets.tree_fc_samples(4, leaves=8, seed=3)
    return {"tree_lstm": sst, "var_lstm": var, "fixed_lstm": fixed, "tree_fc": tree_fc}


def backend_name():
    return os.environ.get("CAVS_BACKEND", "numpy")


@pytest.fixture
def importable_fake(monkeypatch):
    """Cell subprocesses import the fake systems (tests/harness/fake_system.py) by name."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
