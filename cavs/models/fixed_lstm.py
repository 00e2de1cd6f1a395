"""LSTM language model over fixed-length chains (64 tokens of PTB)."""
import numpy as np

import cavs
from cavs import concat, sigmoid, tanh

from . import workloads


def cell(v, p):
    x = v.pull()                                  # embedding of this step's token
    h_prev, c_prev = v.gather(0).split(2)         # previous step's state (zeros at t = 0)
    i, f, o, u = (x @ p.Wx + h_prev @ p.Wh + p.b).split(4)
    c = sigmoid(f) * c_prev + sigmoid(i) * tanh(u)
    h = sigmoid(o) * tanh(c)
    v.scatter(concat(h, c))
    v.push(h)


def model(hidden: int, embed: int | None = None, workload: str = "fixed_lstm", **common) -> cavs.Model:
    h, e, vocab = hidden, embed or hidden, len(workloads.datasets.ptb_vocab())
    b = np.zeros(4 * h)
    b[h:2 * h] = 1.0                              # forget-gate bias starts at 1
    return cavs.Model(cell, {"Wx": (e, 4 * h), "Wh": (h, 4 * h), "b": b},
                      arity=1, state=2 * h, embedding=(vocab, e), classes=vocab,
                      reader=lambda samples: workloads.to_graphs(workload, samples), name=workload, **common)
