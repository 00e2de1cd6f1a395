"""The paper's four models, each a vertex function and its `cavs.Model(...)` call, written with
the public API only; and what belongs to their workloads (docs/workloads.md), kept here, out of the
engine: the data sets (`datasets`), sizes, initial values and readers (`workloads`).

    model = cavs.models.build("tree_lstm", hidden=64, seed=0, dtype="float64")
    batch = model.make_batch(cavs.datasets.load_samples("tree_lstm", limit=64))   # raw SST lines
"""
from __future__ import annotations

from ..model import check_whole
from . import datasets, workloads
from . import fixed_lstm, tree_fc, tree_lstm, var_lstm

MODELS = {"fixed_lstm": fixed_lstm.model, "var_lstm": var_lstm.model,
          "tree_fc": tree_fc.model, "tree_lstm": tree_lstm.model}
CELLS = {"fixed_lstm": fixed_lstm.cell, "var_lstm": var_lstm.cell,
         "tree_fc": tree_fc.cell, "tree_lstm": tree_lstm.cell}


def build(name: str, hidden: int = 64, seed: int = 0, dtype="float32", reduction: str = "mean",
          leaves: int = 256, embed: int | None = None):
    """A paper model as a `cavs.Model` that also accepts its workload's raw samples in make_batch.
    `leaves` is Tree-FC's tree size (the data's, not the model's); `embed` the embedding width
    (Tree-LSTM: 300, the LSTMs: = hidden)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    for what, value in (("hidden", hidden), ("leaves", leaves), ("embed", 1 if embed is None else embed)):
        check_whole(what, value)
    kwargs = {} if embed is None or name == "tree_fc" else {"embed": embed}
    model = MODELS[name](hidden, seed=seed, dtype=dtype, reduction=reduction, **kwargs)
    model.workload, model.hidden, model.leaves = name, hidden, leaves
    return model


__all__ = ["build", "MODELS", "CELLS", "datasets", "workloads"]
