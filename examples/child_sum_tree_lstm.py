"""A child-sum Tree-LSTM (Tai et al. 2015) over n-ary trees, written with the public API only.

    python examples/child_sum_tree_lstm.py            # trains on 512 n-ary SST trees, then predicts

Each vertex sums its children's hidden states for the input, output and update gates, and gives
each child its own forget gate. `gather_all()` returns one state per child slot up to the arity;
a slot a vertex does not use reads zeros, and the engine skips every slot that no vertex of a
task uses (and all the work downstream of it).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import cavs
from cavs import concat, sigmoid, tanh


def cell(v, p):
    x = v.pull()                                   # the word's embedding (zeros inside the tree)
    children = [s.split(2) for s in v.gather_all()]   # [(h_k, c_k)] for every child slot
    h_sum = sum(h for h, _ in children)
    i, o, u = (x @ p.W + h_sum @ p.U + p.b).split(3)
    fx = x @ p.Wf + p.bf                           # the forget gates' input part, shared by all children
    c = sigmoid(i) * tanh(u)
    for h_k, c_k in children:
        c = c + sigmoid(fx + h_k @ p.Uf) * c_k       # one forget gate per child
    h = sigmoid(o) * tanh(c)
    v.scatter(concat(h, c))
    v.push(h)


def model(arity: int, hidden: int, embed: int, vocab: int, classes: int = 5, **options) -> cavs.Model:
    H, E = hidden, embed
    return cavs.Model(cell, {"W": (E, 3 * H), "U": (H, 3 * H), "b": (3 * H,),
                             "Wf": (E, H), "Uf": (H, H), "bf": np.ones(H)},   # forget bias 1
                      arity=arity, state=2 * H, embedding=(vocab, E), classes=classes, **options)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--embed", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args(argv)

    trees = cavs.datasets.sst_nary_trees("train", limit=args.trees)     # SST merged into n-ary trees
    arity = max(int((g.children >= 0).sum(axis=1).max()) for g in trees)
    vocab = len(cavs.datasets.sst_vocab()) + 1
    m = model(arity, args.hidden, args.embed, vocab)
    engine = cavs.Engine(m, optimizer=cavs.optim.Adagrad(lr=0.05, weight_decay=1e-4))
    batches = [m.make_batch(trees[i:i + args.batch_size])
               for i in range(0, len(trees) - args.batch_size + 1, args.batch_size)]
    print(f"{len(trees)} trees, arity {arity}, {len(batches)} batches of {args.batch_size}")
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        losses = [engine.step(b) for b in batches]
        print(f"epoch {epoch}: mean loss {np.mean(losses):.4f} ({time.perf_counter() - t0:.2f} s)")
    probs = engine.predict(batches[0])
    roots = np.array([p[-1].argmax() for p in probs])     # post-order: the root is the last vertex
    gold = np.array([g.labels[-1] for g in trees[:args.batch_size]])
    print(f"root accuracy on the first batch (training data): {(roots == gold).mean():.2f}")
    return np.mean(losses)


if __name__ == "__main__":
    main()
