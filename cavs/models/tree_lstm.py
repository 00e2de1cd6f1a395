"""Binary Tree-LSTM (Tai et al. 2015, N = 2) on SST, as in the Cavs paper's Figure 4."""
import numpy as np

import cavs
from cavs import concat, sigmoid, tanh

from . import workloads


def cell(v, p):
    x = v.pull()                                  # word embedding on leaves, zeros inside
    hl, cl = v.gather(0).split(2)                 # left child's state [h; c]
    hr, cr = v.gather(1).split(2)                 # right child's state
    g = x @ p.Wx + concat(hl, hr) @ p.Uh + p.b
    i, fl, fr, o, u = g.split(5)
    i, fl, fr, o, u = sigmoid(i), sigmoid(fl), sigmoid(fr), sigmoid(o), tanh(u)
    c = i * u + fl * cl + fr * cr
    h = o * tanh(c)
    v.scatter(concat(h, c))
    v.push(h)


def model(hidden: int, embed: int = workloads.TREE_LSTM_EMBED, **common) -> cavs.Model:
    h, vocab = hidden, len(workloads.datasets.sst_vocab()) + 1
    b = np.zeros(5 * h)
    b[h:3 * h] = 1.0                              # forget-gate biases (fl, fr) start at 1
    return cavs.Model(cell, {"Wx": (embed, 5 * h), "Uh": (2 * h, 5 * h), "b": b},
                      arity=2, state=2 * h, embedding=(vocab, embed), classes=workloads.SST_CLASSES,
                      reader=lambda lines: workloads.to_graphs("tree_lstm", lines), name="tree_lstm", **common)
