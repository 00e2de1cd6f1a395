"""A GRU language model (Cho et al. 2014) over PTB sentences, each sentence a chain, written with
the public API only.

    python examples/gru_language_model.py               # 256 PTB sentences, a few epochs, then a perplexity

Each sentence w_0 .. w_{n-1} is a chain of n - 1 vertices: vertex t reads w_t and is trained to
predict w_{t+1} (classes = the vocabulary), its only child is vertex t - 1. The vertex function is
one GRU step: `gather(0)` is the previous hidden state (zeros at the first word).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import cavs
from cavs import sigmoid, tanh


def cell(v, p):
    x, h_prev = v.pull(), v.gather(0)              # this word's embedding, the previous state
    z, r = sigmoid(x @ p.Wzr + h_prev @ p.Uzr + p.bzr).split(2)    # update and reset gates
    n = tanh(x @ p.Wn + (r * h_prev) @ p.Un + p.bn)
    h = n + z * (h_prev - n)                       # (1 - z) * n + z * h_prev
    v.scatter(h)
    v.push(h)


def model(hidden: int, embed: int, vocab: int, **options) -> cavs.Model:
    H, E = hidden, embed
    return cavs.Model(cell, {"Wzr": (E, 2 * H), "Uzr": (H, 2 * H), "bzr": (2 * H,),
                             "Wn": (E, H), "Un": (H, H), "bn": (H,)},
                      arity=1, state=H, embedding=(vocab, E), classes=vocab, **options)


def sentence_graph(words, name: str) -> cavs.Graph:
    """Vertex t reads words[t] and predicts words[t + 1]; its child is vertex t - 1."""
    n = len(words) - 1
    return cavs.Graph.from_children([[t - 1] if t else [] for t in range(n)],
                                    tokens=list(words[:-1]), labels=list(words[1:]), name=name)


def positive(text: str) -> int:
    """argparse type: a count of at least 1 (a bad one is named, not a traceback later)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=positive, default=128)
    ap.add_argument("--batch-size", type=positive, default=32)
    ap.add_argument("--hidden", type=positive, default=64)
    ap.add_argument("--embed", type=positive, default=32)
    ap.add_argument("--epochs", type=positive, default=3)
    ap.add_argument("--max-length", type=positive, default=20, help="longer sentences are cut (a short run)")
    ap.add_argument("--fusion", type=int, default=1, help="0: no generated kernels (no compile time)")
    args = ap.parse_args(argv)
    if args.max_length < 2:                        # a sentence of n words predicts n - 1 of them
        ap.error(f"--max-length must be at least 2 (one word to read, one to predict), got {args.max_length}")

    sentences = cavs.datasets.load_samples("var_lstm", "train", limit=args.sentences)
    vocab = len(cavs.datasets.ptb_vocab())
    graphs = [sentence_graph(s[:args.max_length], f"PTB train sentence {i + 1}") for i, s in enumerate(sentences)]
    m = model(args.hidden, args.embed, vocab)
    engine = cavs.Engine(m, optimizer=cavs.optim.Adam(lr=0.01, clip_norm=5.0), fusion=bool(args.fusion))
    batches = [m.make_batch(graphs[i:i + args.batch_size]) for i in range(0, len(graphs), args.batch_size)]
    print(f"{len(graphs)} sentences, vocabulary {vocab}, {len(batches)} batches")
    means = []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        losses = [engine.step(b) for b in batches]
        means.append(float(np.mean(losses)))
        print(f"epoch {epoch}: mean loss {means[-1]:.4f}, perplexity {np.exp(means[-1]):.1f} "
              f"({time.perf_counter() - t0:.2f} s)")
    probs = engine.predict(batches[0])[0]            # the first sentence: one row per word
    g = graphs[0]
    gold = probs[np.arange(g.num_vertices), g.labels]
    print(f"first sentence: mean probability of the next word {gold.mean():.4f}")
    return means


if __name__ == "__main__":
    main()
