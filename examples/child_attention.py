"""Attention over children: each vertex of an n-ary SST tree weighs its children by a learned score
(softmax over the vertex's edges) instead of summing them, trained, then used to predict.

    python examples/child_attention.py                # trains on 512 n-ary SST trees, then predicts

`kids.softmax(s_k)` normalises a per-edge score over each vertex's edges (weight 1 where a vertex
has one child); the score is width 1 and broadcasts over the state's width in `a_k * h_k`; a leaf
has no edges, and every reduction over them gives zeros.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import cavs
from cavs import concat, sigmoid, tanh


def cell(v, p):
    x = v.pull()                                   # the word's embedding (zeros inside the tree)
    kids = v.children()
    h_k, c_k = kids.state.split(2)                 # each child's state, one row per edge
    query = kids.broadcast(tanh(x @ p.Wq + p.bq))  # what this vertex looks for, on each of its edges
    a_k = kids.softmax(cavs.feature_sum(query * (h_k @ p.K)))     # one weight per child, summing to 1
    h_att, c_att = (a_k * h_k).sum(), (a_k * c_k).sum()
    i, o, u = (x @ p.W + h_att @ p.U + p.b).split(3)
    c = sigmoid(i) * tanh(u) + c_att
    h = sigmoid(o) * tanh(c)
    v.scatter(concat(h, c))
    v.push(h)


def model(hidden: int, embed: int, vocab: int, classes: int = 5) -> cavs.Model:
    H, E = hidden, embed
    return cavs.Model(cell, {"Wq": (E, H), "bq": (H,), "K": (H, H), "W": (E, 3 * H), "U": (H, 3 * H),
                             "b": (3 * H,)},
                      state=2 * H, embedding=(vocab, E), classes=classes)


def positive(text: str) -> int:
    """argparse type: a count of at least 1 (a bad one is named, not a traceback later)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=positive, default=512, help="n-ary SST training trees")
    ap.add_argument("--batch-size", type=positive, default=64, help="trees per step")
    ap.add_argument("--hidden", type=positive, default=64, help="h")
    ap.add_argument("--embed", type=positive, default=64, help="embedding width")
    ap.add_argument("--epochs", type=positive, default=2, help="passes over the trees")
    args = ap.parse_args(argv)
    if args.trees < args.batch_size:              # the last partial batch is dropped (WORKLOADS.md)
        ap.error(f"--trees {args.trees} is fewer than one batch of --batch-size {args.batch_size}")

    trees = cavs.datasets.sst_nary_trees("train", limit=args.trees)
    vocab = len(cavs.datasets.sst_vocab()) + 1
    m = model(args.hidden, args.embed, vocab)
    engine = cavs.Engine(m, optimizer=cavs.optim.Adagrad(lr=0.05, weight_decay=1e-4))
    batches = [m.make_batch(trees[i:i + args.batch_size])
               for i in range(0, len(trees) - args.batch_size + 1, args.batch_size)]
    print(f"{len(trees)} trees, {len(batches)} batches of {args.batch_size}")
    losses = []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        losses.append(float(np.mean([engine.step(b) for b in batches])))
        print(f"epoch {epoch}: mean loss {losses[-1]:.4f} ({time.perf_counter() - t0:.2f} s)")
    probs = engine.predict(batches[0])
    roots = np.array([p[-1].argmax() for p in probs])
    gold = np.array([g.labels[-1] for g in trees[:args.batch_size]])
    print(f"root accuracy on the first batch (training data): {(roots == gold).mean():.2f}")
    return losses


if __name__ == "__main__":
    main()
