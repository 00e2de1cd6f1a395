"""The paper's four models as vertex functions, and `build(name, ...)` to make one.

A model couples a vertex function (traced once into F, differentiated once into dF) with its
workload's sizes, initial parameters, data set, and the graph reader for its raw samples.
"""
from __future__ import annotations

import numpy as np

from .. import datasets, workloads
from ..grad import derive
from ..graphs import InputError, make_forest
from ..scheduler import schedule
from ..vertex import trace
from . import fixed_lstm, tree_fc, tree_lstm, var_lstm

CELLS = {"fixed_lstm": fixed_lstm.cell, "var_lstm": var_lstm.cell,
         "tree_fc": tree_fc.cell, "tree_lstm": tree_lstm.cell}
# parameters used outside F: the embedding that feeds pull, the softmax head on push
OUTSIDE_F = ("emb", "Wout", "bout")


class Batch:
    """The input graphs of one batch (a Forest) and what the engine derives from them once."""

    def __init__(self, forest):
        self.forest = forest
        self._cache = {}

    def cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def schedule(self, policy: str):
        return self.cached(("schedule", policy), lambda: schedule(self.forest, policy))

    @property
    def num_samples(self) -> int:
        return self.forest.num_samples


class Model:
    def __init__(self, workload: str, cell, hidden: int, seed: int = 0, dtype="float32",
                 leaves: int = 256, embed: int | None = None):
        self.workload, self.hidden, self.seed, self.leaves = workload, hidden, seed, leaves
        self.dtype = np.dtype(dtype).name
        self.sizes = workloads.sizes(workload, hidden, leaves, embed)
        self.param_shapes = workloads.param_shapes(workload, self.sizes)
        inside = {k: v for k, v in self.param_shapes.items() if k not in OUTSIDE_F}
        state_width = cell.state_width(hidden)
        self.F = trace(cell, self.sizes.arity, state_width, self.sizes.embed, inside)
        self.dF = derive(self.F)

    def init_params(self) -> dict[str, np.ndarray]:
        return workloads.init_params(self.workload, self.hidden, self.seed, self.dtype, self.leaves,
                                     self.sizes.embed)

    def make_batch(self, samples: list) -> Batch:
        """Reads raw samples into input graphs (errors name the file/line or sample and vertex)."""
        if len(samples) == 0:
            raise InputError(f"{self.workload}: empty batch: no samples were given")
        graphs = workloads.to_graphs(self.workload, samples)
        return Batch(make_forest(graphs, self.sizes.arity))

    def load_samples(self, split: str = "train", limit: int | None = None) -> list:
        return datasets.load_samples(self.workload, split, limit, self.leaves, self.seed)


def build(name: str, hidden: int = 64, seed: int = 0, dtype="float32", **sizes) -> Model:
    """`cavs.models.build("tree_lstm", hidden=64, seed=0, dtype="float64")`; sizes: leaves, embed."""
    if name not in CELLS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(CELLS)}")
    return Model(name, CELLS[name], hidden, seed, dtype, **sizes)
