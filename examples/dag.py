"""A recursive network over DAGs whose vertices share children, on float features (inputs=D),
written with the public API only: a small synthetic task.

    python examples/dag.py              # trains on 256 random DAGs, then reports accuracy on new ones

Each sample is a random DAG: vertex v picks up to 3 children among the earlier vertices, so a
vertex is often the child of several parents. Every vertex has D random features; its value is
x_v[0] plus half the sum of its children's values (computed through the DAG, shared children
counted once per parent), and its label says whether that value is positive. The model must carry
information from descendants, through the shared children, to get it right.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import cavs
from cavs import sigmoid, tanh

ARITY = 3


def cell(v, p):
    x = v.pull()                               # the vertex's own features (width D)
    kids = sum(v.gather_all())                 # the children's states, summed (zeros where absent)
    g = sigmoid(x @ p.Wg + kids @ p.Ug + p.bg)
    h = g * tanh(x @ p.W + kids @ p.U + p.b)    # a gated update of the vertex's state
    v.scatter(h)
    v.push(h)


def model(hidden: int, features: int, **options) -> cavs.Model:
    H, D = hidden, features
    return cavs.Model(cell, {"W": (D, H), "U": (H, H), "b": (H,), "Wg": (D, H), "Ug": (H, H), "bg": (H,)},
                      arity=ARITY, state=H, inputs=D, classes=2, **options)


def random_dag(rng, n: int, features: int, name: str) -> cavs.Graph:
    children = [sorted(rng.choice(v, size=min(v, int(rng.integers(0, ARITY + 1))), replace=False).tolist())
                for v in range(n)]
    x = rng.normal(size=(n, features))
    value = np.zeros(n)
    for v in range(n):                         # children come before their parents here
        value[v] = x[v, 0] + 0.5 * sum(value[c] for c in children[v])
    order = rng.permutation(n)                 # and the graph numbers its vertices in any order
    where = np.argsort(order)                  # old vertex -> new number
    return cavs.Graph.from_children([[int(where[c]) for c in children[v]] for v in order],
                                    features=x[order], labels=(value[order] > 0).astype(int), name=name)


def accuracy(engine, batch, graphs) -> float:
    probs = engine.predict(batch)
    return float(np.mean(np.concatenate([p.argmax(axis=1) == g.labels for p, g in zip(probs, graphs)])))


def positive(text: str) -> int:
    """argparse type: a count of at least 1 (a bad one is named, not a traceback later)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", type=positive, default=256)
    ap.add_argument("--vertices", type=positive, default=12)
    ap.add_argument("--features", type=positive, default=4)
    ap.add_argument("--hidden", type=positive, default=16)
    ap.add_argument("--batch-size", type=positive, default=32)
    ap.add_argument("--epochs", type=positive, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fusion", type=int, default=1, help="0: no generated kernels (no compile time)")
    args = ap.parse_args(argv)
    if args.vertices < 2:                          # each DAG has 2 to --vertices vertices
        ap.error(f"--vertices must be at least 2, got {args.vertices}")

    rng = np.random.default_rng(args.seed)
    graphs = [random_dag(rng, int(rng.integers(2, args.vertices + 1)), args.features, f"dag {i}")
              for i in range(args.graphs)]
    held_out = [random_dag(rng, args.vertices, args.features, f"held-out dag {i}") for i in range(64)]
    m = model(args.hidden, args.features, seed=args.seed)
    engine = cavs.Engine(m, optimizer=cavs.optim.Adam(lr=0.02), fusion=bool(args.fusion))
    batches = [m.make_batch(graphs[i:i + args.batch_size]) for i in range(0, len(graphs), args.batch_size)]
    test = m.make_batch(held_out)
    print(f"{len(graphs)} DAGs of up to {args.vertices} vertices, {len(batches)} batches; "
          f"held-out accuracy before training {accuracy(engine, test, held_out):.2f}")
    means = []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        means.append(float(np.mean([engine.step(b) for b in batches])))
        print(f"epoch {epoch}: mean loss {means[-1]:.4f} ({time.perf_counter() - t0:.2f} s)")
    print(f"held-out accuracy {accuracy(engine, test, held_out):.2f}")
    return means


if __name__ == "__main__":
    main()
