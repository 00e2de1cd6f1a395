"""The paper's Figure 4: a child-sum Tree-LSTM (Tai et al. 2015) on n-ary SST trees, trained, then
used to predict.

    python examples/child_sum_tree_lstm.py            # trains on 512 n-ary SST trees, then predicts

The vertex function reads its children as edges: `v.children()` has one row per (child -> vertex)
edge, so any number of children is accepted (no arity), the per-child forget gates run once over
all the edges of a task, and `.sum()` reduces them into each vertex (zeros at a leaf). The same
cell is cavs.models.child_sum.cell.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import cavs
from cavs import concat, sigmoid, tanh


def cell(v, p):
    x = v.pull()                                   # the word's embedding (zeros inside the tree)
    kids = v.children()                            # one row per edge (child -> this vertex)
    h_k, c_k = kids.state.split(2)                 # what each child scattered
    i, o, u = (x @ p.W + h_k.sum() @ p.U + p.b).split(3)
    f_k = sigmoid(kids.broadcast(x @ p.Wf + p.bf) + h_k @ p.Uf)   # the vertex's value, on each of its edges
    c = sigmoid(i) * tanh(u) + (f_k * c_k).sum()
    h = sigmoid(o) * tanh(c)
    v.scatter(concat(h, c))
    v.push(h)


def model(hidden: int, embed: int, vocab: int, classes: int = 5) -> cavs.Model:
    H, E = hidden, embed
    return cavs.Model(cell, {"W": (E, 3 * H), "U": (H, 3 * H), "b": (3 * H,), "Wf": (E, H), "Uf": (H, H),
                             "bf": np.ones(H)},                      # forget bias 1
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

    trees = cavs.datasets.sst_nary_trees("train", limit=args.trees)     # SST merged into n-ary trees
    vocab = len(cavs.datasets.sst_vocab()) + 1
    m = model(args.hidden, args.embed, vocab)
    engine = cavs.Engine(m, optimizer=cavs.optim.Adagrad(lr=0.05, weight_decay=1e-4))
    batches = [m.make_batch(trees[i:i + args.batch_size])
               for i in range(0, len(trees) - args.batch_size + 1, args.batch_size)]
    degree = max(int((g.children >= 0).sum(axis=1).max()) for g in trees)
    print(f"{len(trees)} trees (largest degree {degree}), {len(batches)} batches of {args.batch_size}")
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        losses = [engine.step(b) for b in batches]
        print(f"epoch {epoch}: mean loss {np.mean(losses):.4f} ({time.perf_counter() - t0:.2f} s)")
    probs = engine.predict(batches[0])
    roots = np.array([p[-1].argmax() for p in probs])     # post-order: the root is the last vertex
    gold = np.array([g.labels[-1] for g in trees[:args.batch_size]])
    print(f"root accuracy on the first batch (training data): {(roots == gold).mean():.2f}")
    return float(np.mean(losses))                # the last epoch's mean loss


if __name__ == "__main__":
    main()
