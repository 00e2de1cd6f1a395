"""Input graphs as data: each sample's structure is a few index arrays, never a computation graph.

A `Graph` is one sample: `children[v, k]` is the k-th child of vertex v (-1 where absent),
`tokens[v]` the external input of v (-1: none, `pull()` gives zeros), `labels[v]` the loss
target at v (-1: no loss there). Vertices may be numbered in any order; a vertex may have
several parents (a DAG). `Forest` concatenates the graphs of a batch with global indices.

Graphs are built from child lists or parent arrays here, and read from text by readers.py.
`validate` (and every constructor) raise `InputError` naming the sample and the vertex at fault.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


class InputError(ValueError):
    """Bad input data: the message names the file/line or sample and the vertex at fault."""


@dataclass
class Graph:
    children: np.ndarray  # (n, arity) int64, -1 = no child in that slot
    tokens: np.ndarray    # (n,) int64, -1 = no external input
    labels: np.ndarray    # (n,) int64, -1 = no loss at this vertex
    name: str = "sample"
    features: np.ndarray | None = None   # (n, D) float inputs, for models declared with inputs=D

    @property
    def num_vertices(self) -> int:
        return len(self.tokens)

    @property
    def arity(self) -> int:
        return self.children.shape[1]

    @classmethod
    def from_children(cls, children, tokens=None, labels=None, features=None, name: str = "graph") -> "Graph":
        """A graph from ragged child lists: `children[v]` lists v's children in slot order
        (gather(k) reads the k-th). Vertices may come in any order and a vertex may be the
        child of several parents (a DAG); cycles are found when the graph is batched."""
        try:
            lists = [list(c) for c in children]
        except TypeError:
            raise InputError(f"{name}: children must be a list of child lists, one per vertex") from None
        n = len(lists)
        if n == 0:
            raise InputError(f"{name}: empty graph (no vertices)")
        width = max(1, max(len(c) for c in lists))
        arr = np.full((n, width), -1, dtype=np.int64)
        for v, c in enumerate(lists):
            for k, child in enumerate(c):
                if not isinstance(child, (int, np.integer)) or isinstance(child, bool):
                    raise InputError(f"{name}: vertex {v} child {k} is {child!r}, not a vertex index")
                arr[v, k] = child
        listed = np.arange(width) < np.array([len(c) for c in lists])[:, None]
        bad = listed & ((arr < 0) | (arr >= n))
        if bad.any():
            v, k = (int(x) for x in np.argwhere(bad)[0])
            raise InputError(f"{name}: vertex {v} child {k} is {lists[v][k]}, out of range for a graph "
                             f"of {n} vertices")
        return cls._checked(arr, tokens, labels, features, name)

    @classmethod
    def from_parents(cls, parents, tokens=None, labels=None, features=None, name: str = "graph") -> "Graph":
        """A tree from `parents[v]` (-1 for the root); children keep increasing vertex order."""
        g = from_parent_array(parents, name=name)
        return cls._checked(g.children, tokens, labels, features, name)

    @classmethod
    def _checked(cls, children, tokens, labels, features, name) -> "Graph":
        n = len(children)
        arrays = {}
        for what, values in (("tokens", tokens), ("labels", labels)):
            a = vertex_ids(values, n, what, name)
            if a.ndim != 1:
                raise InputError(f"{name}: {what} must be a flat list, one entry per vertex; got shape {a.shape}")
            if a.shape != (n,):
                raise InputError(f"{name}: {what} has {len(a)} entries for {n} vertices")
            arrays[what] = a
        if features is not None:
            features = np.asarray(features)
            if features.ndim != 2 or len(features) != n or features.dtype.kind not in "fiu":
                raise InputError(f"{name}: features must be a numeric (num_vertices={n}, D) array, "
                                 f"got shape {features.shape}")
        g = cls(children, arrays["tokens"], arrays["labels"], name, features)
        validate(g, acyclic=False)
        return g


def validate(g: Graph, arity: int | None = None, acyclic: bool = True) -> None:
    """Checks ranges, arity and (unless acyclic=False) acyclicity; errors name sample and vertex."""
    n = g.num_vertices
    if n == 0:
        raise InputError(f"{g.name}: empty graph (no vertices)")
    if g.children.ndim != 2 or g.children.shape[0] != n or len(g.labels) != n:
        raise InputError(f"{g.name}: children/tokens/labels disagree on the number of vertices")
    if arity is not None and g.arity > arity:
        used = (g.children[:, arity:] >= 0).any(axis=1)
        if used.any():
            v = int(np.flatnonzero(used)[0])
            raise InputError(f"{g.name}: vertex {v} has {int((g.children[v] >= 0).sum())} children, "
                             f"more than the vertex function's arity {arity}")
    bad = (g.children < -1) | (g.children >= n)
    if bad.any():
        v, k = (int(x) for x in np.argwhere(bad)[0])
        raise InputError(f"{g.name}: vertex {v} child {k} is {int(g.children[v, k])}, "
                         f"out of range for a graph of {n} vertices")
    if acyclic:
        _raise_on_cycle(levels(g.children), [g.name], np.array([0, n]))


def _raise_on_cycle(level: np.ndarray, names: list[str], offsets: np.ndarray) -> None:
    unplaced = np.flatnonzero(level < 0)
    if len(unplaced):
        v = int(unplaced[0])
        i = int(np.searchsorted(offsets, v, side="right")) - 1
        raise InputError(f"{names[i]}: the graph has a cycle; vertex {v - int(offsets[i])} is on it or above it")


def levels(children: np.ndarray) -> np.ndarray:
    """Longest path from a leaf to each vertex (leaves 0); -1 for vertices on or above a cycle.

    Vectorized Kahn's algorithm: one NumPy pass per level, so cost is O(depth * edges).
    """
    n = children.shape[0]
    level = np.full(n, -1, dtype=np.int64)
    has_child = children >= 0
    safe = np.where(has_child, children, 0)
    level[~has_child.any(axis=1)] = 0
    while True:
        child_level = np.where(has_child, level[safe], 0)
        new = (level < 0) & np.where(has_child, child_level >= 0, True).all(axis=1)
        if not new.any():
            return level
        level[new] = child_level[new].max(axis=1) + 1


def from_parent_array(parents, tokens=None, labels=None, arity: int | None = None,
                      name: str = "sample") -> Graph:
    """A tree from `parents[v]` (-1 for the root); children keep increasing vertex order."""
    if isinstance(parents, str):
        raise InputError(f"{name}: parents must be a list of vertex indices (-1 for the root), got a str")
    parents = vertex_ids(parents, 0, "parents", name)      # 2.5 is refused, not truncated to 2
    if parents.ndim != 1:
        raise InputError(f"{name}: parents must be a flat list, one entry per vertex; got shape {parents.shape}")
    n = len(parents)
    if n == 0:
        raise InputError(f"{name}: empty parent array")
    bad = (parents < -1) | (parents >= n)
    if bad.any():
        v = int(np.flatnonzero(bad)[0])
        raise InputError(f"{name}: vertex {v} has parent {int(parents[v])}, out of range for {n} vertices")
    counts = np.bincount(parents[parents >= 0], minlength=n)
    width = int(counts.max()) if arity is None else arity
    if counts.max() > width:
        v = int(np.argmax(counts))
        raise InputError(f"{name}: vertex {v} has {int(counts[v])} children, more than arity {width}")
    children = np.full((n, max(width, 1)), -1, dtype=np.int64)
    fill = np.zeros(n, dtype=np.int64)
    for v in range(n):
        p = parents[v]
        if p >= 0:
            children[p, fill[p]] = v
            fill[p] += 1
    g = Graph(children, vertex_ids(tokens, n), vertex_ids(labels, n), name)
    validate(g)
    return g


def vertex_ids(values, n: int, what: str = "values", name: str = "graph") -> np.ndarray:
    """Integer ids per vertex (-1 where absent); a fractional or non-numeric entry is an error."""
    if values is None:
        return np.full(n, -1, dtype=np.int64)
    a = np.asarray(values)
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    if a.dtype.kind != "f" and a.size:
        raise InputError(f"{name}: {what} must be integers, got {a.dtype} values")
    bad = a != np.round(a) if a.size else np.zeros(0, dtype=bool)
    if bad.any():
        v = int(np.flatnonzero(bad.ravel())[0])
        raise InputError(f"{name}: vertex {v} has {what[:-1]} {a.ravel()[v].item()!r}, not an integer")
    return a.astype(np.int64)


# ---------------------------------------------------------------- a batch of graphs

@dataclass
class Forest:
    """The graphs of one batch, concatenated: global vertex ids, sample of each vertex, and the
    edges as index arrays (each edge's parent, child and child slot, sorted by parent then slot),
    so that everything derived from a batch costs in proportion to its edges, whatever the degrees."""
    tokens: np.ndarray       # (N,)
    labels: np.ndarray       # (N,)
    sample: np.ndarray       # (N,) index of the sample each vertex belongs to
    offsets: np.ndarray      # (num_samples + 1,) first global id of each sample
    names: list[str]
    level: np.ndarray        # (N,) longest path from a leaf (the batched scheduler's frontier)
    edge_parent: np.ndarray  # (E,) global ids, non-decreasing
    edge_child: np.ndarray   # (E,)
    edge_slot: np.ndarray    # (E,) the child's slot at its parent (gather(k) reads slot k)
    width: int               # slots per vertex: the arity, or the largest degree in the batch
    features: np.ndarray | None = None   # (N, D) the graphs' features (models with inputs=D)

    @property
    def num_vertices(self) -> int:
        return len(self.tokens)

    @property
    def num_samples(self) -> int:
        return len(self.names)

    @functools.cached_property
    def children(self) -> np.ndarray:
        """(N, width) global ids of each vertex's child in each slot, -1 where absent (for child
        slots; a model on edges never builds it)."""
        out = np.full((self.num_vertices, max(1, self.width)), -1, dtype=np.int64)
        out[self.edge_parent, self.edge_slot] = self.edge_child
        return out


def edge_levels(n: int, parent: np.ndarray, child: np.ndarray) -> np.ndarray:
    """`levels` from an edge list: the longest path from a leaf to each vertex (leaves 0), -1 on or
    above a cycle (Kahn's algorithm: a vertex is placed when its last child is, one level above
    its highest child). One compiled pass over the edges: the NumPy version's frontier by
    frontier was a sixth of a Tree-LSTM batch's construction."""
    parent = np.ascontiguousarray(parent, dtype=np.int64)
    child = np.ascontiguousarray(child, dtype=np.int64)
    return _kahn_levels()(int(n), parent, child)


@functools.lru_cache(maxsize=None)
def _kahn_levels():
    import numba

    @numba.njit(cache=True, nogil=True)
    def kahn_levels(n, parent, child):
        level = np.full(n, -1, dtype=np.int64)
        highest = np.zeros(n, dtype=np.int64)      # 1 + the highest level among a vertex's placed children
        pending = np.zeros(n, dtype=np.int64)      # children not yet placed
        start = np.zeros(n + 1, dtype=np.int64)    # the edges of child v: by_child[start[v]:start[v + 1]]
        for e in range(len(parent)):
            pending[parent[e]] += 1
            start[child[e] + 1] += 1
        for v in range(n):
            start[v + 1] += start[v]
        fill = start[:-1].copy()
        by_child = np.empty(len(parent), dtype=np.int64)
        for e in range(len(parent)):
            by_child[fill[child[e]]] = e
            fill[child[e]] += 1
        queue = np.empty(n, dtype=np.int64)
        tail = 0
        for v in range(n):
            if pending[v] == 0:
                level[v] = 0
                queue[tail] = v
                tail += 1
        head = 0
        while head < tail:
            v = queue[head]
            head += 1
            for i in range(start[v], start[v + 1]):
                p = parent[by_child[i]]
                highest[p] = max(highest[p], level[v] + 1)
                pending[p] -= 1
                if pending[p] == 0:
                    level[p] = highest[p]
                    queue[tail] = p
                    tail += 1
        return level
    return kahn_levels


def _check_slots(graphs, stacked, owner, offsets, sizes, arity) -> None:
    """validate()'s range and arity checks over a batch's stacked child slots; the first graph at
    fault is named, with its first fault (numbered as in that graph)."""
    over = (stacked[:, arity:] >= 0).any(axis=1) if arity is not None and stacked.shape[1] > arity \
        else np.zeros(len(stacked), dtype=bool)
    bad = (stacked < -1) | (stacked >= sizes[owner][:, None])
    rows = np.flatnonzero(over | bad.any(axis=1))
    if not len(rows):
        return
    i = int(owner[rows[0]])
    validate(graphs[i], arity, acyclic=False)         # raises the message that names it
    raise InputError(f"{graphs[i].name}: vertex {int(rows[0] - offsets[i])} has a child slot out of range")


def make_forest(graphs: list[Graph], arity: int | None, features: int | None = None) -> Forest:
    """Validates every graph against the vertex function's arity (None: any degree) and
    concatenates them; the acyclicity check runs once over the whole batch (its levels are the
    schedule's frontiers). With `features=D` each graph must carry (n, D) features; they become
    the batch's pull table and every vertex's token is its own row in it."""
    if not graphs:
        raise InputError("empty batch: no samples were given")
    for g in graphs:
        for what in ("children", "tokens", "labels"):       # Graph(...) itself converts nothing
            a = getattr(g, what)
            if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
                got = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
                raise InputError(f"{g.name}: {what} must be an integer NumPy array, got {got} (Graph.from_children "
                                 "and Graph.from_parents convert and check lists)")
        n = g.num_vertices
        if n == 0:
            raise InputError(f"{g.name}: empty graph (no vertices)")
        if g.children.ndim != 2 or g.children.shape[0] != n or len(g.labels) != n:
            raise InputError(f"{g.name}: children/tokens/labels disagree on the number of vertices")
        if features is None and g.features is not None:
            raise InputError(f"{g.name}: the graph has features, but the model reads none "
                             "(declare inputs=D to read them with pull())")
        if features is not None:
            f = g.features
            if f is None or f.ndim != 2 or f.shape != (g.num_vertices, features):
                got = "none" if f is None else f"shape {f.shape}"
                raise InputError(f"{g.name}: the model reads {features} features per vertex; "
                                 f"the graph has {got}, expected ({g.num_vertices}, {features})")
            worded = np.flatnonzero(g.tokens >= 0)
            if len(worded):                       # they would be ignored in silence: pull() reads the features
                v = int(worded[0])
                raise InputError(f"{g.name}: vertex {v} has token {int(g.tokens[v])}, but the model reads "
                                 f"features (inputs={features}), not an embedding; give tokens -1 (the default)")
            finite = np.isfinite(f).all(axis=1)
            if not finite.all():
                v = int(np.flatnonzero(~finite)[0])
                bad = f[v][~np.isfinite(f[v])][0]
                raise InputError(f"{g.name}: vertex {v} has a non-finite feature ({bad}); one step on it would "
                                 "turn every parameter into NaN")
    sizes = np.array([g.num_vertices for g in graphs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    # every graph's child slots in one array, checked and read at once (a loop per graph costs
    # more than the arithmetic on a batch of small trees)
    stacked = np.full((int(offsets[-1]), max(g.children.shape[1] for g in graphs)), -1, dtype=np.int64)
    for i, g in enumerate(graphs):
        stacked[offsets[i]:offsets[i + 1], :g.children.shape[1]] = g.children
    owner = np.repeat(np.arange(len(graphs)), sizes)
    _check_slots(graphs, stacked, owner, offsets, sizes, arity)
    slots = stacked if arity is None else stacked[:, :arity]
    edge_parent, k = np.nonzero(slots >= 0)
    edge_child = slots[edge_parent, k] + offsets[owner[edge_parent]]
    # a model on edges numbers each vertex's children 0, 1, ... in slot order (holes closed up)
    edge_slot = k if arity is not None else np.arange(len(edge_parent)) - np.searchsorted(edge_parent, edge_parent)
    edge_parent, edge_child, edge_slot = (a.astype(np.int64) for a in (edge_parent, edge_child, edge_slot))
    width = arity if arity is not None else (int(edge_slot.max()) + 1 if len(edge_slot) else 1)
    names = [g.name for g in graphs]
    level = edge_levels(int(offsets[-1]), edge_parent, edge_child)
    _raise_on_cycle(level, names, offsets)
    if features is None:
        tokens, table = np.concatenate([g.tokens for g in graphs]), None
    else:
        tokens, table = np.arange(offsets[-1], dtype=np.int64), np.concatenate([g.features for g in graphs])
    return Forest(tokens, np.concatenate([g.labels for g in graphs]), np.repeat(np.arange(len(graphs)), sizes),
                  offsets, names, level, edge_parent, edge_child, edge_slot, int(width), table)
