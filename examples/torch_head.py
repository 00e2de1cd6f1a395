"""Heads, losses and optimizers from PyTorch on a Cavs vertex function, through cavs.torch.

    python examples/torch_head.py                 # both parts, about 20 s
    python examples/torch_head.py --part sst

(a) regression: the child-sum Tree-LSTM (no built-in head: classes=None) encodes random trees; a
    torch MLP on each root's state predicts the tree's height (MSE, torch.optim.Adam).
(b) SST: the binary Tree-LSTM of the paper, its words looked up by a torch nn.Embedding whose rows
    feed pull() through `inputs`, a torch softmax head (nn.Linear + cross-entropy over every
    labelled vertex), torch.optim.Adagrad; then root accuracy on a slice of dev.

A model without a head takes graphs without labels: the labels are the torch loss's, so each part
keeps them beside the batch (rows in the batch's vertex order, as the module's outputs).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

import cavs
import cavs.torch
from cavs.models import child_sum, tree_lstm


def unlabelled(g: cavs.Graph) -> cavs.Graph:
    return cavs.Graph(g.children, g.tokens, np.full_like(g.labels, -1), g.name)


def inputs(embedding, batch) -> torch.Tensor:
    """Each vertex's embedding row, zeros for the vertices without a word."""
    tokens = torch.as_tensor(batch.forest.tokens)
    has = tokens >= 0
    x = embedding.weight.new_zeros(batch.num_vertices, embedding.embedding_dim)
    x[has] = embedding(tokens[has])
    return x


# ---------------------------------------------------------------- (a) a regression head

def random_tree(rng, n: int, vocab: int, name: str) -> tuple[cavs.Graph, float]:
    """A random tree of n vertices (each attaches to an earlier one) with a word on every vertex,
    and its height (edges on the longest root-to-leaf path)."""
    parents = [-1] + [int(rng.integers(0, v)) for v in range(1, n)]
    depth = [0] * n
    for v in range(1, n):
        depth[v] = depth[parents[v]] + 1
    g = cavs.Graph.from_parents(parents, tokens=rng.integers(0, vocab, n), name=name)
    return g, float(max(depth))


def regression(args) -> list[float]:
    rng = np.random.default_rng(0)
    vocab = 50
    data = [random_tree(rng, int(rng.integers(1, args.max_vertices + 1)), vocab, f"tree {i}")
            for i in range(args.trees)]
    model = child_sum.model(None, args.hidden, args.embed, vocab, classes=None)
    encoder = cavs.torch.VertexModule(model)
    head = torch.nn.Sequential(torch.nn.Linear(args.hidden, args.hidden), torch.nn.Tanh(),
                               torch.nn.Linear(args.hidden, 1))
    opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=args.lr)
    scale = max(h for _, h in data) or 1.0
    batches = [(model.make_batch([g for g, _ in data[i:i + args.batch_size]]),
                torch.tensor([h / scale for _, h in data[i:i + args.batch_size]]))
               for i in range(0, len(data), args.batch_size)]
    losses = []
    for epoch in range(args.epochs):
        t0, total = time.perf_counter(), 0.0
        for batch, height in batches:
            opt.zero_grad()
            loss = F.mse_loss(head(encoder(batch)[batch.roots]).squeeze(1), height)
            loss.backward()
            opt.step()
            total += float(loss.detach())
        losses.append(total / len(batches))
        print(f"regression epoch {epoch}: mean loss {losses[-1]:.4f} ({time.perf_counter() - t0:.2f} s)")
    return losses


# ---------------------------------------------------------------- (b) SST with a torch head

def spread(split: str, n: int) -> list[str]:
    """n trees spread over the file (SST's files are sorted by sentiment)."""
    lines = cavs.datasets.load_samples("tree_lstm", split)
    return [lines[i] for i in np.linspace(0, len(lines) - 1, min(n, len(lines))).round().astype(int)]


def sst_batch(model, lines):
    graphs = cavs.workloads.to_graphs("tree_lstm", lines)
    labels = torch.as_tensor(np.concatenate([g.labels for g in graphs]))
    return model.make_batch([unlabelled(g) for g in graphs]), labels


def sst(args) -> list[float]:
    h, e = args.hidden, args.embed
    vocab = len(cavs.datasets.sst_vocab()) + 1
    b = np.zeros(5 * h)
    b[h:3 * h] = 1.0                                   # forget-gate biases start at 1
    # embedding=(V, E) gives pull() its width; the torch embedding's rows replace that table
    # (`inputs`), so it is frozen: it stays out of the optimizer and is never read
    model = cavs.Model(tree_lstm.cell, {"Wx": (e, 5 * h), "Uh": (2 * h, 5 * h), "b": b}, arity=2,
                       state=2 * h, embedding=(vocab, e), classes=None, name="tree_lstm")
    encoder = cavs.torch.VertexModule(model, frozen=("emb",))
    embedding = torch.nn.Embedding(vocab, e, sparse=True)     # sparse: Adagrad updates the rows looked up
    torch.sparse.check_sparse_tensor_invariants.disable()     # (torch warns on sparse updates unless told)
    head = torch.nn.Linear(h, 5)
    opt = torch.optim.Adagrad([p for m in (encoder, embedding, head) for p in m.parameters() if p.requires_grad],
                              lr=0.05)
    train, dev = spread("train", args.sst_trees), spread("dev", args.dev_trees)
    batches = [sst_batch(model, train[i:i + args.batch_size]) for i in range(0, len(train), args.batch_size)]
    losses = []
    for epoch in range(args.epochs):
        encoder.train()
        t0, total = time.perf_counter(), 0.0
        for batch, labels in batches:
            opt.zero_grad()
            labelled = labels >= 0
            loss = F.cross_entropy(head(encoder(batch, inputs=inputs(embedding, batch))[labelled]), labels[labelled])
            loss.backward()
            opt.step()
            total += float(loss.detach())
        losses.append(total / len(batches))
        print(f"sst epoch {epoch}: mean loss {losses[-1]:.4f} ({time.perf_counter() - t0:.2f} s)")
    encoder.eval()
    batch, labels = sst_batch(model, dev)
    with torch.no_grad():
        guess = head(encoder(batch, inputs=inputs(embedding, batch))[batch.roots]).argmax(dim=1)
    accuracy = float((guess == labels[batch.roots]).float().mean())
    print(f"dev root accuracy (fine-grained, {len(dev)} trees): {accuracy:.3f}")
    return losses


def positive(text: str) -> int:
    """argparse type: a count of at least 1 (a bad one is named, not a traceback later)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("regression", "sst", "both"), default="both")
    ap.add_argument("--trees", type=positive, default=1000, help="random trees of the regression")
    ap.add_argument("--max-vertices", type=positive, default=20, help="largest random tree")
    ap.add_argument("--sst-trees", type=positive, default=3000, help="SST training trees")
    ap.add_argument("--dev-trees", type=positive, default=200, help="SST dev trees")
    ap.add_argument("--batch-size", type=positive, default=25, help="trees per step")
    ap.add_argument("--hidden", type=positive, default=64, help="h")
    ap.add_argument("--embed", type=positive, default=64, help="embedding width")
    ap.add_argument("--epochs", type=positive, default=8, help="passes over the trees")
    ap.add_argument("--lr", type=float, default=0.01, help="the regression's Adam learning rate")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    out = {}
    if args.part in ("regression", "both"):
        out["regression"] = regression(args)
    if args.part in ("sst", "both"):
        out["sst"] = sst(args)
    return out


if __name__ == "__main__":
    main()
