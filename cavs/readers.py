"""Readers: input graphs from the data sets' text, and the synthetic structures of the workloads.

PTB-bracketed trees (SST: `parse_ptb_tree`, and `parse_ptb_trees` for a whole batch at once),
chains (the language models' sentences) and complete binary trees (Tree-FC). Each raises
`InputError` naming the sample (its file and line, where a `SourceLine` carries them) and the
place at fault.
"""
from __future__ import annotations

import functools
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


def parse_ptb_trees(lines: list[str], vocab: dict[str, int], names: list[str],
                    lowercase: bool = True, unknown: int = 0, classes: int | None = None) -> list[Graph] | None:
    """`parse_ptb_tree` for a whole batch of lines at once, in one compiled pass over their
    characters (`_ptb_scanner`).

    Reading a Tree-LSTM batch's trees was 7% of Cavs's epoch at h = 64 on the Zen 3 EPYC:
    1.3 ms a batch by the NumPy pass over the characters that this replaces, 0.4 ms now (and line by
    line in Python, before either, 3 ms). This takes only the plain form, `(label word)` leaves and
    `(label (...) (...))` nodes with one-digit labels and at most two children, separated by
    spaces; it returns None for any batch with another line (or, given `classes`, a label of
    `classes` or more). The caller then parses line by line, which handles the rest or raises the
    error that names the line. Gives the same graphs as `parse_ptb_tree` (tests/engine/test_graphs.py).
    """
    if len(names) != len(lines):
        raise ValueError(f"{len(lines)} lines but {len(names)} names")
    text = "\n".join(lines) + "\n"
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    ok, children, labels, leaves, letters, first = _ptb_scanner()(codes, len(lines))
    if not ok or (classes is not None and len(labels) and int(labels.max()) >= classes):
        return None
    words = letters.tobytes().decode("utf-32-le")
    words = (words.lower() if lowercase else words).split("\n")
    tokens = np.full(len(labels), -1, dtype=np.int64)
    tokens[leaves] = np.fromiter(map(vocab.get, words, itertools.repeat(unknown)), dtype=np.int64, count=len(words))
    bounds = first.tolist()
    return [Graph(children[a:b], tokens[a:b], labels[a:b], name)
            for a, b, name in zip(bounds[:-1], bounds[1:], names)]


@functools.lru_cache(maxsize=None)
def _ptb_scanner():
    """scan(codes, lines) -> (ok, children, labels, leaves, letters, first) over the code points
    of the batch's lines, each ended by "\n": children (n, 2) numbered within each line (post-order,
    as parse_ptb_tree numbers them), labels (n,), the leaves' vertices, their words' code points
    ("\n" between words; a word's runs of spaces made one, as parse_ptb_tree's tokens are joined),
    and each line's first vertex (lines + 1). ok is False, and the rest empty, where a line is not
    in the plain form."""
    import numba

    @numba.njit(cache=True, nogil=True)
    def scan(c, lines):
        n = len(c)
        size = 0
        for i in range(n):
            size += c[i] == 40
        children = np.full((size, 2), -1, dtype=np.int64)
        labels = np.empty(size, dtype=np.int64)
        leaves = np.empty(size, dtype=np.int64)
        letters = np.empty(n, dtype=np.uint32)
        first = np.zeros(lines + 1, dtype=np.int64)
        stack = np.empty((size + 1, 3), dtype=np.int64)      # an open node: label, child, child
        failed = (False, children[:0], labels[:0], leaves[:0], letters[:0], first)
        out = 0                                              # letters written
        v = words = depth = line = roots = 0
        i = 0
        while i < n:
            ch = c[i]
            if ch == 40:                                    # "(d " then "(" or a word
                if roots or i + 3 >= n or not 48 <= c[i + 1] <= 57 or c[i + 2] != 32 \
                        or c[i + 3] == 32 or c[i + 3] == 41:
                    return failed
                stack[depth, 0], stack[depth, 1], stack[depth, 2] = c[i + 1] - 48, -1, -1
                depth += 1
                i += 3
                if c[i] != 40:                              # a leaf: its word runs to the next ")"
                    if words:
                        letters[out] = 10
                        out += 1
                    space = False
                    while i < n and c[i] != 41:
                        ch = c[i]
                        if ch == 40 or 9 <= ch <= 13 or 0x1c <= ch <= 0x1f or ch == 0x85 or ch == 0xa0 \
                                or ch == 0x1680 or 0x2000 <= ch <= 0x200a or ch == 0x2028 or ch == 0x2029 \
                                or ch == 0x202f or ch == 0x205f or ch == 0x3000:   # "(", or \s but " "
                            return failed
                        if ch == 32:
                            space = True
                        else:
                            if space:
                                letters[out] = 32
                                out += 1
                                space = False
                            letters[out] = ch
                            out += 1
                        i += 1
                    if i == n:
                        return failed
                    leaves[words] = v
                    words += 1
            elif ch == 41:                                  # ")": vertex v, in post-order
                if depth == 0:
                    return failed
                depth -= 1
                labels[v] = stack[depth, 0]
                for k in range(2):
                    if stack[depth, 1 + k] >= 0:
                        children[v, k] = stack[depth, 1 + k] - first[line]
                if depth:
                    if stack[depth - 1, 2] >= 0:            # a third child
                        return failed
                    stack[depth - 1, 1 if stack[depth - 1, 1] < 0 else 2] = v
                else:
                    roots += 1
                v += 1
                i += 1
                while i < n and c[i] == 32:
                    i += 1
                if i < n and c[i] != 40 and c[i] != 41 and c[i] != 10:   # a word beside subtrees
                    return failed
            elif ch == 10:                                  # a line ends: one whole tree on it
                if depth or roots != 1 or line == lines:
                    return failed
                line += 1
                first[line], roots = v, 0
                i += 1
            elif ch == 32:
                i += 1
            else:                                           # text outside the brackets
                return failed
        if line != lines:
            return failed
        return True, children, labels, leaves[:words], letters[:out], first
    return scan


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
