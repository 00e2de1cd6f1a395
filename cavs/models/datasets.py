"""The workloads' data sets, read from the project's own copy in data/ (never the network).

Raw samples, shared by the engine and every baseline:
  tree_lstm   an SST line (a `SourceLine`: a str that knows its file and line)
  var_lstm    a PTB sentence as token ids, `<eos>` appended (input = ids[:-1], target = ids[1:])
  fixed_lstm  65 consecutive token ids of the PTB stream (64 inputs, the next 64 as targets)
  tree_fc     (leaf token ids, root label) of a synthetic complete binary tree
"""
from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

import numpy as np

from ..graphs import InputError
from ..model import check_whole
from ..readers import SourceLine

DATA_DIR = Path(os.environ.get("CAVS_DATA", Path(__file__).resolve().parents[2] / "data"))
FIXED_T = 64
TREE_FC_VOCAB = 1000
TREE_FC_CLASSES = 5
TREE_FC_EPOCH = 8192


def _open_bytes(path: Path) -> tuple:
    """(binary file, the name it is read under): `path`, or its .gz beside it."""
    if path.exists():
        return open(path, "rb"), path.name
    gz = path.with_name(path.name + ".gz")
    if gz.exists():
        return gzip.open(gz, "rb"), gz.name
    raise FileNotFoundError(f"data file {path} (or {gz.name}) not found; the project ships it in data/")


def _lines(path: Path) -> list[SourceLine]:
    """The file's lines, each knowing its file and line. A byte that is not UTF-8, or a truncated
    .gz, is an InputError naming the file (and the line)."""
    f, name = _open_bytes(path)
    with f:
        try:
            data = f.read()
        except (EOFError, OSError) as e:        # a truncated or corrupt .gz
            raise InputError(f"{name}: unreadable ({e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, line_start = data.count(b"\n", 0, e.start) + 1, data.rfind(b"\n", 0, e.start) + 1
        raise InputError(f"{name}, line {line}: not UTF-8 text (byte "
                         f"{e.start - line_start + 1} of the line is {data[e.start]:#04x})") from None
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()                             # the newline that ends the file
    return [SourceLine(line.rstrip("\r"), f"{path.name}:{i + 1}") for i, line in enumerate(lines)]


# ---------------------------------------------------------------- SST

SPLITS = {"sst": ("train", "dev", "test"), "ptb": ("train", "valid", "test")}


def _split(corpus: str, split: str) -> str:
    """A split the corpus has (a typo used to read as a missing data file)."""
    if split not in SPLITS[corpus]:
        raise ValueError(f"unknown {corpus.upper()} split {split!r}; choose one of {', '.join(SPLITS[corpus])}")
    return split


@functools.lru_cache(maxsize=None)
def sst_lines(split: str) -> tuple[SourceLine, ...]:
    _split("sst", split)
    return tuple(line for line in _lines(DATA_DIR / "sst" / f"{split}.txt") if line.strip())


@functools.lru_cache(maxsize=None)
def sst_vocab() -> dict[str, int]:
    """Lower-cased words of the SST training trees, ids 1..V in sorted order; 0 is unknown."""
    from ..readers import parse_ptb_tree
    words = set()
    for line in sst_lines("train"):
        _, leaf_words = parse_ptb_tree(line, None, line.origin)
        words.update(w.lower() for w in leaf_words)
    return {w: i + 1 for i, w in enumerate(sorted(words))}


# ---------------------------------------------------------------- PTB

@functools.lru_cache(maxsize=None)
def ptb_vocab() -> dict[str, int]:
    """The 9999 word types of ptb.train.txt plus <eos>, ids in sorted order."""
    words = {"<eos>"}
    for line in _lines(DATA_DIR / "ptb" / "ptb.train.txt"):
        words.update(line.split())
    return {w: i for i, w in enumerate(sorted(words))}


@functools.lru_cache(maxsize=None)
def ptb_sentences(split: str) -> tuple[tuple[int, ...], ...]:
    _split("ptb", split)
    vocab = ptb_vocab()
    out = []
    for line in _lines(DATA_DIR / "ptb" / f"ptb.{split}.txt"):
        words = line.split()
        if not words:
            continue
        unknown = [w for w in words if w not in vocab]
        if unknown:
            raise InputError(f"{line.origin}: word {unknown[0]!r} is not in the PTB vocabulary")
        out.append(tuple(vocab[w] for w in words) + (vocab["<eos>"],))
    return tuple(out)


def ptb_fixed_chunks(split: str) -> list[tuple[int, ...]]:
    """The token stream cut into samples of T+1 tokens (T inputs, targets shifted by one)."""
    stream = np.fromiter((t for s in ptb_sentences(split) for t in s), dtype=np.int64)
    count = (len(stream) - 1) // FIXED_T
    return [tuple(stream[i * FIXED_T: i * FIXED_T + FIXED_T + 1].tolist()) for i in range(count)]


# ---------------------------------------------------------------- synthetic trees

def tree_fc_samples(count: int = TREE_FC_EPOCH, leaves: int = 256, seed: int = 0):
    """Complete binary trees: leaf tokens uniform in [0, 1000), root label uniform in [0, 5)."""
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, TREE_FC_VOCAB, size=(count, leaves))
    labels = rng.integers(0, TREE_FC_CLASSES, size=count)
    return [(tuple(toks[i].tolist()), int(labels[i])) for i in range(count)]


def load_samples(workload: str, split: str = "train", limit: int | None = None, leaves: int = 256,
                 seed: int = 0) -> list:
    """The workload's raw samples in file order (tree_fc: generated with `seed`); the first `limit`
    of them (None: all)."""
    if limit is not None:                     # None: all
        check_whole("limit", limit)
    if workload == "tree_lstm":
        samples = list(sst_lines(split))
    elif workload == "var_lstm":
        samples = [s for s in ptb_sentences(split) if len(s) >= 2]
    elif workload == "fixed_lstm":
        samples = ptb_fixed_chunks(split)
    elif workload == "tree_fc":
        samples = tree_fc_samples(limit or TREE_FC_EPOCH, leaves, seed)
    else:
        raise ValueError(f"unknown workload {workload!r}")
    return samples[:limit] if limit is not None else samples


def shuffled(samples: list, seed: int = 0) -> list:
    """The data set shuffled once with a seed (docs/workloads.md: batches are consecutive samples of it)."""
    order = np.random.default_rng(seed).permutation(len(samples))
    return [samples[i] for i in order]


def sst_nary_trees(split: str = "train", limit: int | None = None, splice: float = 0.6, seed: int = 0):
    """SST's binary trees merged into n-ary ones (`cavs.Graph`s with SST's words and labels), for
    models of variable arity: each internal vertex but the root is spliced out with probability
    `splice` (its children join its parent's, in order), drawn from `default_rng(seed)`. With
    0.6 most vertices keep 2-3 children and long flat phrases reach 20-30."""
    from ..graphs import Graph
    from ..readers import parse_ptb_tree
    if not isinstance(splice, (int, float)) or isinstance(splice, bool) or not 0 <= splice <= 1:
        raise ValueError(f"splice must be a probability in [0, 1], got {splice!r}")
    rng = np.random.default_rng(seed)
    vocab = sst_vocab()
    out = []
    for line in load_samples("tree_lstm", split, limit):
        g, _ = parse_ptb_tree(line, vocab, line.origin)
        kids = [[int(c) for c in row if c >= 0] for row in g.children]
        internal = np.array([bool(k) for k in kids])
        spliced = internal & (rng.random(g.num_vertices) < splice)
        spliced[-1] = False                                   # the root (post-order: last) stays

        def merged(v):
            return [m for c in kids[v] for m in (merged(c) if spliced[c] else [c])]
        order, new_kids = [], {}
        stack = [(g.num_vertices - 1, False)]
        while stack:                                          # post-order over kept vertices
            v, done = stack.pop()
            if done:
                order.append(v)
                continue
            new_kids[v] = merged(v)
            stack.append((v, True))
            stack.extend((c, False) for c in reversed(new_kids[v]))
        index = {v: i for i, v in enumerate(order)}
        out.append(Graph.from_children([[index[c] for c in new_kids[v]] for v in order],
                                       tokens=g.tokens[order], labels=g.labels[order], name=line.origin))
    return out
