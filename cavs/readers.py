"""Readers: input graphs from the data sets' text, and the synthetic structures of the workloads.

PTB-bracketed trees (SST: `parse_ptb_tree`, and `parse_ptb_trees` for a whole batch at once),
chains (the language models' sentences) and complete binary trees (Tree-FC). Each raises
`InputError` naming the sample (its file and line, where a `SourceLine` carries them) and the
place at fault.
"""
from __future__ import annotations

import itertools
import re

import numpy as np

from .graphs import Graph, InputError, vertex_ids


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
    first = np.repeat(bounds[:-1], np.diff(bounds))             # each vertex's line's first vertex
    local = np.where(children >= 0, children - first[:, None], -1)  # numbered within its line
    bounds = bounds.tolist()
    return [Graph(local[a:b], tokens[a:b], labels[a:b], name)
            for a, b, name in zip(bounds[:-1], bounds[1:], names)]


def chain(tokens, labels=None, name: str = "chain") -> Graph:
    """A chain of len(tokens) vertices; vertex t's only child is t-1."""
    n = len(tokens)
    if n == 0:
        raise InputError(f"{name}: empty chain")
    children = (np.arange(n, dtype=np.int64) - 1)[:, None]
    return Graph(children, np.asarray(tokens, dtype=np.int64), vertex_ids(labels, n), name)


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
