"""Input graphs as data: each sample's structure is a few index arrays, never a computation graph.

A `Graph` is one sample: `children[v, k]` is the k-th child of vertex v (-1 where absent),
`tokens[v]` the external input of v (-1: none, `pull()` gives zeros), `labels[v]` the loss
target at v (-1: no loss there). Vertices may be numbered in any order; a vertex may have
several parents (a DAG). `Forest` concatenates the graphs of a batch with global indices.

Readers: PTB-bracketed trees (SST), parent arrays, chains, complete binary trees.
Every reader and `validate` raise `InputError` naming the sample (file and line where known)
and the vertex at fault.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import numpy as np


class InputError(ValueError):
    """Bad input data: the message names the file/line or sample and the vertex at fault."""


class SourceLine(str):
    """A raw text sample that remembers where it came from (for error messages)."""

    origin: str

    def __new__(cls, text: str, origin: str):
        obj = super().__new__(cls, text)
        obj.origin = origin
        return obj

    def __reduce__(self):            # picklable, e.g. for Fold-N's preprocessing workers
        return SourceLine, (str(self), self.origin)


def origin_of(sample, index: int) -> str:
    return getattr(sample, "origin", None) or f"sample {index}"


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
            a = _arr(values, n, what, name)
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


# ---------------------------------------------------------------- readers

_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def parse_ptb_tree(line: str, vocab: dict[str, int] | None, name: str = "tree",
                   lowercase: bool = True, unknown: int = 0) -> tuple[Graph, list[str]]:
    """Parses a PTB-bracketed binary tree, e.g. `(3 (2 The) (4 (2 is) (4 good)))`.

    Vertices are numbered in post-order (children before parents, root last). Every node's
    label becomes its loss target; a leaf's word becomes its token (vocab id, `unknown`
    when absent; -1 when vocab is None). Returns the graph and the leaf words.
    """
    parts = _TOKEN.findall(line)
    if not parts:
        raise InputError(f"{name}: empty line, expected a bracketed tree")
    children: list[list[int]] = []
    tokens: list[int] = []
    labels: list[int] = []
    words: list[str] = []
    stack: list[list] = []  # each entry: [label, child ids, word]
    pos = 0
    root = None
    while pos < len(parts):
        tok = parts[pos]
        if tok == "(":
            if root is not None:
                raise InputError(f"{name}: text after the root's closing bracket (token {pos + 1})")
            if pos + 1 >= len(parts) or parts[pos + 1] in "()":
                raise InputError(f"{name}: '(' at token {pos + 1} is not followed by a label")
            if stack and stack[-1][2] is not None:
                raise InputError(f"{name}: node with word {stack[-1][2]!r} at token {pos + 1} mixes words and subtrees")
            try:
                label = int(parts[pos + 1])
            except ValueError:
                raise InputError(f"{name}: label {parts[pos + 1]!r} at token {pos + 2} is not an integer") from None
            stack.append([label, [], None])
            pos += 2
        elif tok == ")":
            if not stack:
                raise InputError(f"{name}: unbalanced brackets: unexpected ')' at token {pos + 1}")
            label, kids, word = stack.pop()
            if word is None and not kids:
                raise InputError(f"{name}: node ending at token {pos + 1} has neither word nor children")
            if len(kids) > 2:
                raise InputError(f"{name}: node ending at token {pos + 1} has {len(kids)} children; "
                                 "binary trees have at most 2")
            v = len(labels)
            children.append(kids + [-1] * (2 - len(kids)))
            labels.append(label)
            if word is not None:
                words.append(word)
                w = word.lower() if lowercase else word
                tokens.append(-1 if vocab is None else vocab.get(w, unknown))
            else:
                tokens.append(-1)
            if stack:
                stack[-1][1].append(v)
            else:
                root = v
            pos += 1
        else:
            if not stack:
                raise InputError(f"{name}: word {tok!r} outside any bracket (token {pos + 1})")
            top = stack[-1]
            if top[1]:
                raise InputError(f"{name}: node with word {tok!r} at token {pos + 1} mixes words and subtrees")
            top[2] = tok if top[2] is None else f"{top[2]} {tok}"   # SST has words like "8 1\/2"
            pos += 1
    if stack:
        raise InputError(f"{name}: unbalanced brackets: {len(stack)} '(' never closed")
    g = Graph(np.asarray(children, dtype=np.int64).reshape(-1, 2),
              np.asarray(tokens, dtype=np.int64), np.asarray(labels, dtype=np.int64), name)
    return g, words


_OPEN, _CLOSE, _SPACE, _NEWLINE = 40, 41, 32, 10
# whitespace (as the tokenizer's \s) other than " " and "\n": the fast path's only separators
_OTHER_SPACE = re.compile("[\t\x0b\x0c\r\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")


def parse_ptb_trees(lines: list[str], vocab: dict[str, int], names: list[str],
                    lowercase: bool = True, unknown: int = 0) -> list[Graph] | None:
    """`parse_ptb_tree` for a whole batch of lines at once, vectorized over its characters.

    Reading trees line by line in Python was a third of the Tree-LSTM epoch at h = 64. This
    takes only the plain form, `(label word)` leaves and `(label (...) (...))` nodes with
    one-digit labels and at most two children, and returns None for any batch with another
    line; the caller then parses line by line, which handles the rest or raises the error that
    names the line. Gives the same graphs as `parse_ptb_tree` (tests/test_graphs.py).
    """
    if len(names) != len(lines):
        raise ValueError(f"{len(lines)} lines but {len(names)} names")
    text = "\n".join(lines) + "\n"
    if _OTHER_SPACE.search(text):
        return None
    c = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    is_open, is_close = c == _OPEN, c == _CLOSE
    opens, closes = np.flatnonzero(is_open), np.flatnonzero(is_close)
    newlines = np.flatnonzero(c == _NEWLINE)
    if len(newlines) != len(lines) or len(opens) != len(closes) or (opens + 3 >= len(c)).any():
        return None
    depth = np.cumsum(is_open.astype(np.int32) - is_close)     # after each character
    roots = closes[depth[closes] == 0]
    after = c[opens + 3]                                        # "(" of a first child, or a word
    nonspace = np.flatnonzero(c != _SPACE)
    after_close = c[nonspace[np.searchsorted(nonspace, closes, side="right")]]
    parens = np.flatnonzero(is_open | is_close)
    is_leaf = after != _OPEN
    next_paren = c[parens[np.searchsorted(parens, opens[is_leaf], side="right")]]
    if ((depth < 0).any() or len(roots) != len(lines)
            or (np.searchsorted(newlines, roots) != np.arange(len(lines))).any()   # one root per line
            or ((depth == 0) & ~is_close & (c != _SPACE) & (c != _NEWLINE)).any()  # text outside
            or ((c[opens + 1] - 48) > 9).any() or (c[opens + 2] != _SPACE).any()  # "(d " labels
            or (after == _SPACE).any() or (after == _CLOSE).any()
            or ((after_close != _OPEN) & (after_close != _CLOSE) & (after_close != _NEWLINE)).any()
            or (next_paren != _CLOSE).any()):                  # a leaf holds words only
        return None
    # match brackets: at each depth, opens and closes alternate along the text
    if depth.max() >= 2 ** 15:
        return None
    level = depth.astype(np.int16)          # a radix sort
    open_of = np.empty_like(closes)
    open_of[np.argsort(level[closes] + 1, kind="stable")] = opens[np.argsort(level[opens], kind="stable")]
    n = len(closes)                              # vertex v = the v-th ")" = post-order
    counted = np.cumsum(is_close)
    size = counted[closes] - counted[open_of]    # vertices in v's subtree
    leaf = c[open_of + 3] != _OPEN
    v = np.arange(n)
    right = np.where(leaf, -1, v - 1)              # an inner vertex's last child is v - 1
    right_size = size[np.maximum(v - 1, 0)]
    rest = np.where(leaf, 0, size - 1 - right_size)  # vertices left of that child's subtree
    left = np.where(rest > 0, v - 1 - right_size, -1)
    if (rest < 0).any() or (size[left[rest > 0]] != rest[rest > 0]).any():   # 3+ children
        return None
    children = np.stack([np.where(rest > 0, left, right), np.where(rest > 0, right, -1)], axis=1)
    tokens = np.full(n, -1, dtype=np.int64)
    starts, ends = open_of[leaf] + 3, closes[leaf]
    lowered = text.lower() if lowercase else text
    if len(lowered) != len(text):                # a letter whose lower case is longer
        return None
    words = list(map(lowered.__getitem__, map(slice, starts.tolist(), ends.tolist())))
    spaced = np.cumsum(c == _SPACE)
    for k in np.flatnonzero(spaced[ends - 1] != spaced[starts - 1]):   # "8 1\/2": one word
        words[k] = " ".join(words[k].split())
    tokens[leaf] = list(map(vocab.get, words, itertools.repeat(unknown)))
    labels = (c[open_of + 1] - 48).astype(np.int64)
    bounds = np.concatenate([[0], np.searchsorted(closes, newlines)])
    graphs = []
    for i, name in enumerate(names):
        a, b = int(bounds[i]), int(bounds[i + 1])
        kids = children[a:b]
        graphs.append(Graph(np.where(kids >= 0, kids - a, -1), tokens[a:b], labels[a:b], name))
    return graphs


def from_parent_array(parents, tokens=None, labels=None, arity: int | None = None,
                      name: str = "sample") -> Graph:
    """A tree from `parents[v]` (-1 for the root); children keep increasing vertex order."""
    parents = np.asarray(parents, dtype=np.int64)
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
    g = Graph(children, _arr(tokens, n), _arr(labels, n), name)
    validate(g)
    return g


def chain(tokens, labels=None, name: str = "chain") -> Graph:
    """A chain of len(tokens) vertices; vertex t's only child is t-1."""
    n = len(tokens)
    if n == 0:
        raise InputError(f"{name}: empty chain")
    children = (np.arange(n, dtype=np.int64) - 1)[:, None]
    return Graph(children, np.asarray(tokens, dtype=np.int64), _arr(labels, n), name)


def complete_binary_tree(leaf_tokens, root_label: int = -1, name: str = "tree") -> Graph:
    """A complete binary tree over L = len(leaf_tokens) leaves (L a power of two), 2L-1 vertices.

    Leaves are vertices 0..L-1; each level's parents follow; the root is last.
    """
    L = len(leaf_tokens)
    if L < 1 or L & (L - 1):
        raise InputError(f"{name}: {L} leaves; a complete binary tree needs a power of two")
    n = 2 * L - 1
    children = np.full((n, 2), -1, dtype=np.int64)
    start, width, nxt = 0, L, L
    while width > 1:
        parents = np.arange(nxt, nxt + width // 2)
        children[parents, 0] = np.arange(start, start + width, 2)
        children[parents, 1] = np.arange(start + 1, start + width, 2)
        start, nxt, width = nxt, nxt + width // 2, width // 2
    tokens = np.full(n, -1, dtype=np.int64)
    tokens[:L] = leaf_tokens
    labels = np.full(n, -1, dtype=np.int64)
    labels[-1] = root_label
    return Graph(children, tokens, labels, name)


def _arr(values, n: int, what: str = "values", name: str = "graph") -> np.ndarray:
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
    """The graphs of one batch, concatenated: global vertex ids, sample of each vertex."""
    children: np.ndarray   # (N, arity) global ids, -1 absent
    tokens: np.ndarray     # (N,)
    labels: np.ndarray     # (N,)
    sample: np.ndarray     # (N,) index of the sample each vertex belongs to
    offsets: np.ndarray    # (num_samples + 1,) first global id of each sample
    names: list[str]
    level: np.ndarray      # (N,) longest path from a leaf (the batched scheduler's frontier)
    features: np.ndarray | None = None   # (N, D) the graphs' features (models with inputs=D)

    @property
    def num_vertices(self) -> int:
        return len(self.tokens)

    @property
    def num_samples(self) -> int:
        return len(self.names)


def make_forest(graphs: list[Graph], arity: int, features: int | None = None) -> Forest:
    """Validates every graph against the vertex function's arity and concatenates them; the
    acyclicity check runs once over the whole batch (its levels are the schedule's frontiers).
    With `features=D` each graph must carry (n, D) features; they become the batch's pull table
    and every vertex's token is its own row in it."""
    if not graphs:
        raise InputError("empty batch: no samples were given")
    for g in graphs:
        validate(g, arity, acyclic=False)
        if features is None and g.features is not None:
            raise InputError(f"{g.name}: the graph has features, but the model reads none "
                             "(declare inputs=D to read them with pull())")
        if features is not None:
            f = g.features
            if f is None or f.ndim != 2 or f.shape != (g.num_vertices, features):
                got = "none" if f is None else f"shape {f.shape}"
                raise InputError(f"{g.name}: the model reads {features} features per vertex; "
                                 f"the graph has {got}, expected ({g.num_vertices}, {features})")
    sizes = np.array([g.num_vertices for g in graphs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    children = np.full((offsets[-1], arity), -1, dtype=np.int64)
    for i, g in enumerate(graphs):
        c = g.children[:, :arity]
        children[offsets[i]:offsets[i + 1], :c.shape[1]] = np.where(c >= 0, c + offsets[i], -1)
    names = [g.name for g in graphs]
    level = levels(children)
    _raise_on_cycle(level, names, offsets)
    if features is None:
        tokens, table = np.concatenate([g.tokens for g in graphs]), None
    else:
        tokens, table = np.arange(offsets[-1], dtype=np.int64), np.concatenate([g.features for g in graphs])
    return Forest(children, tokens,
                  np.concatenate([g.labels for g in graphs]),
                  np.repeat(np.arange(len(graphs)), sizes),
                  offsets, names, level, table)
