"""Cavs: a vertex-centric runtime for dynamic neural networks (Xu et al., USENIX ATC 2018).

    import cavs
    model = cavs.models.build("tree_lstm", hidden=64, seed=0, dtype="float64")
    batch = model.make_batch(samples)
    engine = cavs.Engine(model, backend="numpy", policy="batched")
    loss, grads = engine.loss_and_grads(batch)
"""
from . import datasets, graphs, workloads
from .engine import Engine
from .graphs import InputError
from .vertex import TraceError, concat, relu, sigmoid, tanh, trace
from . import models  # noqa: E402  (models use the vertex-function API above)

__all__ = ["Engine", "InputError", "TraceError", "concat", "relu", "sigmoid", "tanh", "trace",
           "datasets", "graphs", "workloads", "models"]
