"""Trains the child-sum Tree-LSTM of cavs/models/child_sum.py on n-ary SST trees, then predicts.

    python examples/child_sum_tree_lstm.py            # trains on 512 n-ary SST trees, then predicts

The vertex function and the model are written with the public API only (cavs/models/child_sum.py).
The arity is the largest degree in the data: a vertex with fewer children reads zeros in the
slots it does not use, and the engine skips the slots no vertex of a task uses.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import cavs
from cavs.models.child_sum import model


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
