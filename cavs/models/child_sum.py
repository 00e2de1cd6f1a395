"""A child-sum Tree-LSTM (Tai et al. 2015) over n-ary trees, written with the public API only.

Each vertex sums its children's hidden states for the input, output and update gates, and gives
each child its own forget gate. `gather_all()` returns one state per child slot up to the arity;
a slot a vertex does not use reads zeros, and the engine skips every slot that no vertex of a
task uses (and all the work downstream of it). examples/child_sum_tree_lstm.py trains it.
"""
from __future__ import annotations

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
    """The model with `arity` child slots; `options` go to cavs.Model (seed, dtype, reduction...)."""
    H, E = hidden, embed
    return cavs.Model(cell, {"W": (E, 3 * H), "U": (H, 3 * H), "b": (3 * H,),
                             "Wf": (E, H), "Uf": (H, H), "bf": np.ones(H)},   # forget bias 1
                      arity=arity, state=2 * H, embedding=(vocab, E), classes=classes, **options)
