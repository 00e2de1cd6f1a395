"""Input graphs as data: each sample's structure is a few index arrays, never a computation graph.

A `Graph` is one sample: `children[v, k]` is the k-th child of vertex v (-1 where absent; graphs
built from child lists or parent arrays keep the edges and build this array only when it is read),
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


def whole(value) -> bool:
    """A Python or NumPy integer, not a bool (True is an int to Python, never an index or a size)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Graph:
    """One sample. `Graph(children, tokens, labels, name, features)` takes the (n, arity) child-slot
    array as it is; `from_children` and `from_parents` keep the edges instead (each edge's parent,
    slot and child), so that a vertex of many children costs its edges, not n x its degree (a star
    of 20,000 vertices was a 3.2 GB slot array). `children` is then built when it is read."""

    def __init__(self, children, tokens, labels, name: str = "sample", features=None):
        self._children, self._edges = children, None
        self.tokens, self.labels, self.name, self.features = tokens, labels, name, features

    @classmethod
    def _of_edges(cls, parent, slot, child, tokens, labels, name, features) -> "Graph":
        g = cls(None, tokens, labels, name, features)
        g._edges = tuple(np.asarray(a, dtype=np.int64) for a in (parent, slot, child))
        return g

    @property
    def children(self) -> np.ndarray:
        """(n, arity) int64: the k-th child of each vertex, -1 where it has none."""
        if self._children is None:
            parent, slot, child = self._edges
            slots = np.full((self.num_vertices, self.arity), -1, dtype=np.int64)
            slots[parent, slot] = child
            slots.setflags(write=False)      # a view of the edges: an edit in place would not reach them
            self._children = slots
        return self._children

    @children.setter
    def children(self, value) -> None:
        self._children, self._edges = value, None

    def edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(parent, slot, child) of every child slot in use (not -1), by parent, then slot."""
        if self._edges is not None:
            return self._edges
        c = np.asarray(self._children)
        parent, slot = np.nonzero(c != -1)
        return parent, slot, c[parent, slot]

    @property
    def given_slots(self) -> bool:
        """Whether the graph was given a child-slot array (Graph(...), g.children = ...), which
        make_forest checks as it is; graphs from child lists or parent arrays hold edges."""
        return self._edges is None

    @property
    def num_vertices(self) -> int:
        return len(self.tokens)

    @property
    def arity(self) -> int:
        if self._edges is None:
            return self._children.shape[1]
        slot = self._edges[1]
        return int(slot.max()) + 1 if len(slot) else 1

    def __getstate__(self) -> dict:
        # the slot array built from edges is left out: it is rebuilt (read-only) when read
        return {**self.__dict__, "_children": None} if self._edges is not None else self.__dict__

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}: {self.num_vertices} vertices, {len(self.edges()[0])} edges"
                f"{', features' if self.features is not None else ''})")

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
        for v, c in enumerate(lists):
            for k, child in enumerate(c):
                if not whole(child):
                    raise InputError(f"{name}: vertex {v} child {k} is {child!r}, not a vertex index")
        degree = np.array([len(c) for c in lists], dtype=np.int64)
        parent = np.repeat(np.arange(n, dtype=np.int64), degree)
        child = np.fromiter((x for c in lists for x in c), dtype=np.int64, count=int(degree.sum()))
        slot = np.arange(len(parent), dtype=np.int64) - np.repeat(np.cumsum(degree) - degree, degree)
        bad = (child < 0) | (child >= n)
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            raise InputError(f"{name}: vertex {int(parent[e])} child {int(slot[e])} is {int(child[e])}, out of range "
                             f"for a graph of {n} vertices")
        return cls._checked(n, (parent, slot, child), tokens, labels, features, name)

    @classmethod
    def from_parents(cls, parents, tokens=None, labels=None, features=None, name: str = "graph") -> "Graph":
        """A tree from `parents[v]` (-1 for the root); children keep increasing vertex order."""
        g = from_parent_array(parents, name=name)
        return cls._checked(g.num_vertices, g.edges(), tokens, labels, features, name)

    @classmethod
    def _checked(cls, n, edges, tokens, labels, features, name) -> "Graph":
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
        g = cls._of_edges(*edges, arrays["tokens"], arrays["labels"], name, features)
        validate(g, acyclic=False)
        return g


def validate(g: Graph, arity: int | None = None, acyclic: bool = True) -> None:
    """Checks ranges, arity and (unless acyclic=False) acyclicity; errors name sample and vertex."""
    n = g.num_vertices
    if n == 0:
        raise InputError(f"{g.name}: empty graph (no vertices)")
    if (g.given_slots and (g.children.ndim != 2 or g.children.shape[0] != n)) or len(g.labels) != n:
        raise InputError(f"{g.name}: children/tokens/labels disagree on the number of vertices")
    parent, slot, child = g.edges()
    if arity is not None:
        over = np.flatnonzero((slot >= arity) & (child >= 0))
        if len(over):
            v = int(parent[over[0]])
            raise InputError(f"{g.name}: vertex {v} has {int(((parent == v) & (child >= 0)).sum())} children, "
                             f"more than the vertex function's arity {arity}")
    bad = np.flatnonzero((child < 0) | (child >= n))      # child < 0: a slot below -1
    if len(bad):
        e = bad[0]
        raise InputError(f"{g.name}: vertex {int(parent[e])} child {int(slot[e])} is {int(child[e])}, "
                         f"out of range for a graph of {n} vertices")
    if acyclic:
        _raise_on_cycle(edge_levels(n, parent, child), [g.name], np.array([0, n]))


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
    child = np.flatnonzero(parents >= 0)
    child = child[np.argsort(parents[child], kind="stable")]      # by parent, then vertex order
    parent = parents[child]
    slot = np.arange(len(child)) - np.searchsorted(parent, parent)
    if arity is not None and len(slot) and slot.max() >= arity:
        v = int(parent[np.argmax(slot)])
        raise InputError(f"{name}: vertex {v} has {int((parent == v).sum())} children, more than arity {arity}")
    g = Graph._of_edges(parent, slot, child, vertex_ids(tokens, n), vertex_ids(labels, n), name, None)
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


def _batch_edges(graphs, offsets, sizes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every graph's edges with global parent ids, by parent then slot: (parent, slot, the child as
    numbered in its graph). Graphs given as child-slot arrays are stacked and read at once (a loop
    per graph costs more than the arithmetic on a batch of small trees); graphs built from child
    lists or parent arrays bring their edges."""
    dense = [i for i, g in enumerate(graphs) if g._edges is None]
    pieces = []
    if dense:
        slots = [graphs[i]._children for i in dense]
        stacked = np.full((int(sizes[dense].sum()), max(c.shape[1] for c in slots)), -1, dtype=np.int64)
        at = 0
        for c in slots:
            stacked[at:at + len(c), :c.shape[1]] = c
            at += len(c)
        row, slot = np.nonzero(stacked != -1)
        ids = row if len(dense) == len(graphs) else \
            np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in dense])[row]
        pieces.append((ids, slot, stacked[row, slot]))
    for i, g in enumerate(graphs):
        if g._edges is not None:
            parent, slot, child = g._edges
            pieces.append((parent + offsets[i], slot, child))
    parent, slot, child = (np.concatenate(a).astype(np.int64) for a in zip(*pieces))
    if 0 < len(dense) < len(graphs):
        order = np.lexsort((slot, parent))
        parent, slot, child = parent[order], slot[order], child[order]
    return parent, slot, child


def make_forest(graphs: list[Graph], arity: int | None, features: int | None = None) -> Forest:
    """Validates every graph against the vertex function's arity (None: any degree) and
    concatenates them; the acyclicity check runs once over the whole batch (its levels are the
    schedule's frontiers). With `features=D` each graph must carry (n, D) features; they become
    the batch's pull table and every vertex's token is its own row in it."""
    if not graphs:
        raise InputError("empty batch: no samples were given")
    for g in graphs:
        given = g._edges is None            # a child-slot array given to Graph(...), which converts nothing
        arrays = (("children", g._children),) * given + (("tokens", g.tokens), ("labels", g.labels))
        for what, a in arrays:
            if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
                got = a.dtype if isinstance(a, np.ndarray) else type(a).__name__
                raise InputError(f"{g.name}: {what} must be an integer NumPy array, got {got} (Graph.from_children "
                                 "and Graph.from_parents convert and check lists)")
        n = g.num_vertices
        if n == 0:
            raise InputError(f"{g.name}: empty graph (no vertices)")
        if (given and (g._children.ndim != 2 or g._children.shape[0] != n)) or len(g.labels) != n:
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
    owner = np.repeat(np.arange(len(graphs)), sizes)
    edge_parent, k, child = _batch_edges(graphs, offsets, sizes)
    edge_owner = owner[edge_parent]
    bad = (child < 0) | (child >= sizes[edge_owner])           # child < 0: a slot below -1
    if arity is not None:
        bad |= k >= arity
    if bad.any():                                                # the first graph at fault, named by validate
        e = int(np.flatnonzero(bad)[0])
        i = int(edge_owner[e])
        validate(graphs[i], arity, acyclic=False)
        raise InputError(f"{graphs[i].name}: vertex {int(edge_parent[e] - offsets[i])} has a child slot out of range")
    edge_child = child + offsets[edge_owner]
    # a model on edges numbers each vertex's children 0, 1, ... in slot order (holes closed up)
    edge_slot = k if arity is not None else np.arange(len(edge_parent)) - np.searchsorted(edge_parent, edge_parent)
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
