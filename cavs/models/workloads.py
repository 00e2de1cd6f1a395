"""The four workloads of docs/workloads.md as data: sizes, parameter shapes and initial values, and how
a raw sample becomes an input graph. The engine and every baseline use these same functions, so
with one seed all systems start from identical weights on identical graphs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import datasets
from ..model import initial_values
from ..graphs import Graph, InputError
from ..readers import chain, complete_binary_tree, origin_of, parse_ptb_tree, parse_ptb_trees

WORKLOADS = ("fixed_lstm", "var_lstm", "tree_fc", "tree_lstm")
# docs/workloads.md's training rule (revised): SGD on the mean of the batch's loss terms, lr 1.0,
# gradients clipped to a global L2 norm of 5.0 over all parameters together
LEARNING_RATE = 1.0
CLIP_NORM = 5.0
TREE_LSTM_EMBED = 300
SST_CLASSES = 5


@dataclass(frozen=True)
class Sizes:
    hidden: int
    embed: int
    vocab: int
    classes: int   # width of the softmax
    arity: int
    leaves: int = 256


def sizes(workload: str, hidden: int, leaves: int = 256, embed: int | None = None) -> Sizes:
    if workload in ("fixed_lstm", "var_lstm"):
        return Sizes(hidden, embed or hidden, len(datasets.ptb_vocab()), len(datasets.ptb_vocab()), 1)
    if workload == "tree_fc":
        return Sizes(hidden, hidden, datasets.TREE_FC_VOCAB, datasets.TREE_FC_CLASSES, 2, leaves)
    if workload == "tree_lstm":
        return Sizes(hidden, embed or TREE_LSTM_EMBED, len(datasets.sst_vocab()) + 1, SST_CLASSES, 2)
    raise ValueError(f"unknown workload {workload!r}; choose one of {WORKLOADS}")


def param_shapes(workload: str, s: Sizes) -> dict[str, tuple[int, ...]]:
    """Named parameter shapes, in the order their initial values are drawn."""
    h, e = s.hidden, s.embed
    if workload in ("fixed_lstm", "var_lstm"):   # gates i, f, o, u
        cell = {"Wx": (e, 4 * h), "Wh": (h, 4 * h), "b": (4 * h,)}
    elif workload == "tree_fc":
        cell = {"W": (2 * h, h), "b": (h,)}
    elif workload == "tree_lstm":                # gates i, fl, fr, o, u
        cell = {"Wx": (e, 5 * h), "Uh": (2 * h, 5 * h), "b": (5 * h,)}
    else:
        raise ValueError(f"unknown workload {workload!r}")
    return {"emb": (s.vocab, e), **cell, "Wout": (h, s.classes), "bout": (s.classes,)}


def forget_gate_columns(workload: str, h: int) -> slice | None:
    if workload in ("fixed_lstm", "var_lstm"):
        return slice(h, 2 * h)
    if workload == "tree_lstm":
        return slice(h, 3 * h)      # fl and fr
    return None


def init_params(workload: str, hidden: int, seed: int = 0, dtype="float32", leaves: int = 256,
                embed: int | None = None) -> dict[str, np.ndarray]:
    """uniform(-0.1, 0.1) matrices and embeddings, zero biases, forget-gate bias 1.0: the same
    arrays as `cavs.models.build(workload, ...).init_params()` (the model files declare the
    biases as arrays, the rest as shapes), here without tracing a model, for the baselines."""
    specs: dict = dict(param_shapes(workload, sizes(workload, hidden, leaves, embed)))
    forget = forget_gate_columns(workload, hidden)
    if forget is not None:
        specs["b"] = np.zeros(specs["b"])
        specs["b"][forget] = 1.0
    return initial_values(specs, seed, dtype)


def to_graph(workload: str, sample, index: int = 0) -> Graph:
    """One raw sample (see datasets.py) as an input graph with tokens and per-vertex labels."""
    name = origin_of(sample, index)
    if workload == "tree_lstm":
        if not isinstance(sample, str):
            raise InputError(f"{name}: a tree_lstm sample is a PTB-bracketed tree line, got {type(sample).__name__}")
        g, _ = parse_ptb_tree(sample, datasets.sst_vocab(), name)
        if ((g.labels < 0) | (g.labels >= SST_CLASSES)).any():
            v = int(np.flatnonzero((g.labels < 0) | (g.labels >= SST_CLASSES))[0])
            raise InputError(f"{name}: vertex {v} has label {int(g.labels[v])}, outside 0..{SST_CLASSES - 1}")
        return g
    if workload in ("fixed_lstm", "var_lstm"):
        ids = np.asarray(sample, dtype=np.int64)
        if ids.ndim != 1 or len(ids) < 2:
            raise InputError(f"{name}: a language-model sample needs at least 2 token ids, got {len(ids)}")
        vocab = len(datasets.ptb_vocab())
        if ((ids < 0) | (ids >= vocab)).any():
            t = int(np.flatnonzero((ids < 0) | (ids >= vocab))[0])
            raise InputError(f"{name}: token {t} is {int(ids[t])}, outside the vocabulary 0..{vocab - 1}")
        return chain(ids[:-1], ids[1:], name)
    if workload == "tree_fc":
        leaf_tokens, label = sample
        return complete_binary_tree(np.asarray(leaf_tokens, dtype=np.int64), int(label), name)
    raise ValueError(f"unknown workload {workload!r}")


def to_graphs(workload: str, samples: list, first_index: int = 0) -> list[Graph]:
    """`to_graph` for a batch of samples (the k-th named `first_index + k` if it has no origin).
    A batch of plain SST lines is read in one compiled pass (readers.parse_ptb_trees); any other
    batch, or one with a label out of range, line by line, which raises the error naming the line."""
    if workload == "tree_lstm" and samples and all(isinstance(s, str) for s in samples):
        names = [origin_of(s, first_index + i) for i, s in enumerate(samples)]
        graphs = parse_ptb_trees(samples, datasets.sst_vocab(), names, classes=SST_CLASSES)
        if graphs is not None:
            return graphs
    return [to_graph(workload, s, first_index + i) for i, s in enumerate(samples)]
