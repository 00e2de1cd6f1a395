"""A model: the user's vertex function, its parameters and its output head, traced once.

    model = cavs.Model(cell, params={"W": (E, 3 * H), "b": (3 * H,)}, state=2 * H,
                       embedding=(V, E), classes=C, reduction="mean", seed=0, dtype="float32")
    batch = model.make_batch([cavs.Graph.from_children(...), ...])

`Model` traces `cell` into F and derives dF when it is built, so a mistake in the vertex function
is a `TraceError` naming the user's line before any data is read. `arity=K` is needed only by a
vertex function that reads children by position (`v.gather(k)`); one that reads them as edges
(`v.children()`) takes any number. `make_batch` checks every graph against the model (arity where
declared, token range, label range, feature width) and raises `InputError` naming the graph and
the vertex.
"""
from __future__ import annotations

import numpy as np

from .grad import derive
from .graphs import Graph, InputError, make_forest, whole
from .scheduler import schedule
from .vertex import TraceError, trace

REDUCTIONS = ("mean", "sum")
DTYPES = ("float32", "float64")
HEAD = ("Wout", "bout")       # the softmax head on what push sends (outside F)
EMBEDDING = "emb"             # the table pull() reads (outside F)


def initial_values(specs: dict, seed: int, dtype) -> dict[str, np.ndarray]:
    """Arrays for {name: shape or array}: a shape is drawn from `default_rng(seed)` in the given
    order, uniform(-0.1, 0.1) for two or more dimensions and zeros for one (docs/workloads.md); an
    array is used as given. Drawn in float64 and then cast, so float32 and float64 runs start
    from the same numbers."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in specs.items():
        if isinstance(spec, tuple):
            value = np.zeros(spec) if len(spec) == 1 else rng.uniform(-0.1, 0.1, size=spec)
        else:
            value = np.asarray(spec, dtype=np.float64)
        out[name] = value.astype(dtype)
    return out


class Batch:
    """The input graphs of one batch (a Forest) and what the engine derives from them once. Rows of
    the batch's arrays (engine.forward's inputs and outputs) are its vertices in order: graph 0's
    vertices in their own order, then graph 1's, and so on."""

    def __init__(self, forest, graphs=None, model=None):
        self.forest = forest
        self.graphs = graphs
        self.model = model
        self._cache = {}

    @property
    def num_vertices(self) -> int:
        return self.forest.num_vertices

    @property
    def graph_slices(self) -> list[slice]:
        """Per graph, in the order given, the slice of its rows."""
        o = self.forest.offsets.tolist()
        return [slice(a, b) for a, b in zip(o[:-1], o[1:])]

    @property
    def roots(self) -> np.ndarray:
        """The rows of every graph's sinks (vertices that are nobody's child), graph by graph."""
        is_child = np.zeros(self.num_vertices, dtype=bool)
        is_child[self.forest.edge_child] = True
        return np.flatnonzero(~is_child)

    def cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def schedule(self, policy: str):
        return self.cached(("schedule", policy), lambda: schedule(self.forest, policy))

    @property
    def num_samples(self) -> int:
        return self.forest.num_samples


def check_whole(what: str, value, least: int = 1) -> None:
    if not whole(value) or value < least:
        raise ValueError(f"{what} must be a whole number of at least {least}, got {value!r}")


def _spec_of(name: str, spec):
    """A parameter as declared: a shape (a tuple, or a list of whole numbers) to initialise, or its
    initial values (a NumPy array, or a list of numbers that are not all whole), as float64."""
    if isinstance(spec, tuple) or (isinstance(spec, list) and spec and all(whole(d) for d in spec)):
        if not spec or not all(whole(d) for d in spec):
            raise ValueError(f"parameter {name!r}: shape {tuple(spec)} must be whole numbers (give initial values "
                             "as a NumPy array)")
        if any(d <= 0 for d in spec):
            raise ValueError(f"parameter {name!r}: shape {tuple(spec)} must have positive sizes")
        return tuple(int(d) for d in spec)
    a = np.asarray(spec)
    if a.dtype.kind not in "fiu" or a.ndim == 0 or a.size == 0:
        got = f"an empty {type(spec).__name__}" if a.ndim and a.size == 0 else type(spec).__name__
        raise ValueError(f"parameter {name!r}: give a shape tuple or a numeric array, got {got}")
    check_finite(name, a)
    return a.astype(np.float64)


def _shape_of(spec) -> tuple:
    return spec if isinstance(spec, tuple) else spec.shape


def check_finite(name: str, value: np.ndarray) -> None:
    """A parameter's given values must be finite: a NaN or inf would only surface later, as a
    NonFiniteError of the first step that blames the learning rate."""
    bad = ~np.isfinite(value)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"parameter {name!r}: {int(bad.sum())} of its {value.size} values are not finite "
                         f"(the first, at index {where if len(where) > 1 else where[0]}, is {value[where]})")


class Model:
    """One vertex function with its parameters, message widths, input and softmax head."""

    def __init__(self, cell, params: dict | None = None, *, arity: int | None = None, state: int,
                 embedding: tuple[int, int] | None = None, inputs: int | None = None,
                 classes: int | None, reduction: str = "mean", seed: int = 0, dtype="float32",
                 reader=None, name: str | None = None):
        try:
            np.dtype(dtype)
        except TypeError:
            raise ValueError(f"dtype {dtype!r} is not a NumPy dtype; use float32 (or float64)") from None
        check_whole("state", state)
        if inputs is not None:
            check_whole("inputs", inputs)
        if embedding is not None:
            if not isinstance(embedding, (tuple, list)) or len(embedding) != 2:
                raise ValueError(f"embedding must be a pair (V, E): the vocabulary and the width, got {embedding!r}")
            check_whole("embedding's vocabulary V", embedding[0])
            check_whole("embedding's width E", embedding[1])
        check_whole("seed", seed, least=0)
        if np.dtype(dtype).name not in DTYPES:
            raise ValueError(f"dtype {np.dtype(dtype).name} is not supported end to end (the fused kernels, the "
                             f"loss and the products run in {' or '.join(DTYPES)}); use float32")
        if classes is not None and (not whole(classes) or classes < 2):
            raise ValueError(f"classes must be an integer >= 2 for the softmax head, or None for no head "
                             f"(a pure encoder: engine.forward / engine.backward, cavs.torch), got {classes!r}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if embedding is not None and inputs is not None:
            raise ValueError("give embedding=(V, E) (pull() reads a trained table) or inputs=D "
                             "(pull() reads the graph's features), not both")
        if arity is not None and (not whole(arity) or arity < 1):
            raise ValueError(f"arity must be a positive integer (or None for a vertex function that reads "
                             f"its children with v.children()), got {arity!r}")
        params = dict(params or {})
        for reserved in (EMBEDDING, *HEAD):
            if reserved in params:
                raise ValueError(f"parameter name {reserved!r} is reserved for the model's "
                                 f"{'embedding' if reserved == EMBEDDING else 'softmax head'}")
        self.cell, self.state = cell, int(state)
        self.classes = None if classes is None else int(classes)
        self.arity = None if arity is None else int(arity)
        self.reduction, self.seed, self.reader = reduction, seed, reader
        self.dtype = np.dtype(dtype).name
        self.name = name or getattr(cell, "__name__", "model")
        self.vocab, self.embed = (int(embedding[0]), int(embedding[1])) if embedding is not None else (None, None)
        self.inputs = None if inputs is None else int(inputs)
        input_width = self.embed if embedding is not None else self.inputs
        params = {k: _spec_of(k, v) for k, v in params.items()}
        shapes = {k: _shape_of(v) for k, v in params.items()}
        self.F = trace(cell, self.arity, self.state, input_width, shapes)
        if self.F.push is None:
            raise TraceError(f"{self.name}: push was never called; the softmax head and engine.forward read "
                             "what the vertex function pushes")
        self.dF = derive(self.F)
        self.push_width = self.F.push.inputs[0].shape[0]
        head = {"Wout": (self.push_width, self.classes), "bout": (self.classes,)} if self.has_head else {}
        self._specs = {**({EMBEDDING: (self.vocab, self.embed)} if embedding is not None else {}),
                       **params,
                       **head}
        self.param_shapes = {k: _shape_of(v) for k, v in self._specs.items()}

    @property
    def has_head(self) -> bool:
        """Whether the model has the built-in softmax head (classes given), or is a pure encoder."""
        return self.classes is not None

    @property
    def signature(self) -> tuple:
        """What a batch depends on: a batch made by a model of another signature is refused."""
        return (self.name, self.arity, self.state, self.vocab, self.embed, self.inputs, self.classes,
                tuple(sorted(self.param_shapes.items())))

    def describe(self) -> str:
        inputs = f"embedding {self.vocab} x {self.embed}" if self.vocab else f"{self.inputs} features"
        head = f"{self.classes} classes" if self.has_head else "no head"
        return f"{self.name!r} (state {self.state}, {inputs}, {head}, arity {self.arity})"

    @property
    def uses_features(self) -> bool:
        return self.inputs is not None

    def init_params(self) -> dict[str, np.ndarray]:
        return initial_values(self._specs, self.seed, self.dtype)

    def make_batch(self, samples: list) -> Batch:
        """`Graph`s (or the raw samples the model's reader takes) -> a checked, batched forest."""
        if isinstance(samples, Graph):
            raise TypeError(f"{self.name}: make_batch takes a list of graphs, got one cavs.Graph; write "
                            "make_batch([graph])")
        if not isinstance(samples, (list, tuple, str)):
            try:
                samples = list(samples)          # a generator or another iterable of graphs
            except TypeError:
                raise TypeError(f"{self.name}: make_batch takes a list of graphs, got "
                                f"{type(samples).__name__}") from None
        if len(samples) == 0:
            raise InputError(f"{self.name}: empty batch: no graphs were given")
        if all(isinstance(s, Graph) for s in samples):
            graphs = list(samples)
        elif self.reader is not None:
            graphs = self.reader(samples)
        else:
            bad = next(i for i, s in enumerate(samples) if not isinstance(s, Graph))
            raise InputError(f"{self.name}: sample {bad} is a {type(samples[bad]).__name__}, not a "
                             "cavs.Graph (build one with cavs.Graph.from_children or from_parents)")
        # positional gathers need every degree within the arity; edges take whatever the graphs have
        forest = make_forest(graphs, self.arity if self.F.uses_slots else None, features=self.inputs)
        self._check(forest)
        return Batch(forest, graphs, self)

    def _check(self, forest) -> None:
        """Tokens and labels in range for this model, over the whole batch at once."""
        def first_bad(mask, what):
            v = int(np.flatnonzero(mask)[0])
            i = int(np.searchsorted(forest.offsets, v, side="right")) - 1
            local = v - int(forest.offsets[i])
            raise InputError(f"{forest.names[i]}: vertex {local} {what(v)}")
        labels = forest.labels
        bad = (labels < -1) | (labels >= (self.classes if self.has_head else 0))
        if bad.any():
            if not self.has_head:
                first_bad(bad, lambda v: f"has label {int(labels[v])}, but the model has no head (classes=None): "
                                         "give the loss to engine.forward's outputs (or labels -1)")
            first_bad(bad, lambda v: f"has label {int(labels[v])}, outside 0..{self.classes - 1} "
                                     f"(or -1 for no loss)")
        tokens = forest.tokens
        if self.uses_features:
            return
        limit = self.vocab if self.vocab is not None else 0
        bad = (tokens < -1) | (tokens >= limit)
        if bad.any():
            if self.vocab is None:
                first_bad(bad, lambda v: f"has token {int(tokens[v])}, but the model declares no "
                                         "embedding (give embedding=(V, E))")
            first_bad(bad, lambda v: f"has token {int(tokens[v])}, outside the vocabulary "
                                     f"0..{self.vocab - 1} (or -1 for no input)")
