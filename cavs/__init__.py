"""Cavs: a vertex-centric runtime for dynamic neural networks (Xu et al., USENIX ATC 2018).

    import cavs
    from cavs import concat, sigmoid, tanh

    def cell(v, p):                      # one vertex: pull / children() or gather(k) / scatter / push
        ...
    model = cavs.Model(cell, params={...}, state=S, embedding=(V, E), classes=C)
    batch = model.make_batch([cavs.Graph.from_children([[], [], [0, 1]], tokens=[4, 9, -1],
                                                       labels=[-1, -1, 2], name="tree 1")])
    engine = cavs.Engine(model, optimizer=cavs.optim.Adagrad(lr=0.05))
    loss = engine.step(batch)
    probs = engine.predict(batch)

The paper's four models are built the same way: `cavs.models.build("tree_lstm", hidden=64)`.
"""
from . import graphs, optim, readers
from .engine import Engine, NonFiniteError
from .graphs import Graph, InputError
from .model import Batch, Model
from .vertex import (TraceError, abs_ as abs, concat, dropout, exp, feature_mean, feature_sum, layer_norm,  # noqa: A004
                     log, maximum, minimum, relu, sigmoid, tanh, trace)
from . import models  # noqa: E402  (the models use the public API above)
from .models import datasets, workloads  # noqa: E402  (the four workloads' data and sizes)

__all__ = ["Engine", "NonFiniteError", "Model", "Graph", "Batch", "InputError", "TraceError", "optim", "trace",
           "concat", "sigmoid", "tanh", "relu", "exp", "log", "abs", "maximum", "minimum", "feature_sum",
           "feature_mean", "layer_norm", "dropout", "graphs", "readers", "models", "datasets", "workloads"]
