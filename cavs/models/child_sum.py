"""The child-sum Tree-LSTM (Tai et al. 2015) over n-ary trees, the paper's Figure 4, in two forms.

Each vertex sums its children's hidden states for the input, output and update gates, and gives
each child its own forget gate.

- `cell` reads the children as edges (`v.children()`): one row per (child -> vertex) edge, so the
  per-child work (the forget gates' product h_k Uf, the gates, f_k * c_k) runs once over all the
  edges of a task whatever the degrees, and any number of children is accepted.
- `slot_cell` reads them by position (`gather_all()`, one state per child slot up to an arity):
  the traced F has one copy of the per-child work per slot. It is kept as the comparison the
  n-ary benchmark makes (experiments/studies/nary.py); both give the same numbers.

examples/child_sum_tree_lstm.py trains the edge form.
"""
from __future__ import annotations

import numpy as np

import cavs
from cavs import concat, sigmoid, tanh


def cell(v, p):
    x = v.pull()                                   # the word's embedding (zeros inside the tree)
    kids = v.children()                            # one row per edge (child -> this vertex)
    h_k, c_k = kids.state.split(2)                 # what each child scattered
    i, o, u = (x @ p.W + h_k.sum() @ p.U + p.b).split(3)
    f_k = sigmoid(kids.broadcast(x @ p.Wf + p.bf) + h_k @ p.Uf)   # one forget gate per child
    c = sigmoid(i) * tanh(u) + (f_k * c_k).sum()
    h = sigmoid(o) * tanh(c)
    v.scatter(concat(h, c))
    v.push(h)


def slot_cell(v, p):
    x = v.pull()
    children = [s.split(2) for s in v.gather_all()]   # [(h_k, c_k)] for every child slot
    h_sum = sum(h for h, _ in children)
    i, o, u = (x @ p.W + h_sum @ p.U + p.b).split(3)
    fx = x @ p.Wf + p.bf                           # the forget gates' input part, shared by all children
    c = sigmoid(i) * tanh(u)
    for h_k, c_k in children:
        c = c + sigmoid(fx + h_k @ p.Uf) * c_k       # one forget gate per child slot
    h = sigmoid(o) * tanh(c)
    v.scatter(concat(h, c))
    v.push(h)


def params(hidden: int, embed: int) -> dict:
    H, E = hidden, embed
    return {"W": (E, 3 * H), "U": (H, 3 * H), "b": (3 * H,), "Wf": (E, H), "Uf": (H, H),
            "bf": np.ones(H)}                      # forget bias 1


def model(arity: int | None, hidden: int, embed: int, vocab: int, classes: int = 5, **options) -> cavs.Model:
    """The child-sum model: `arity` None reads the children as edges (any degree); a number is the
    slot form with that many child slots. `options` go to cavs.Model (seed, dtype, reduction...)."""
    return cavs.Model(cell if arity is None else slot_cell, params(hidden, embed), arity=arity,
                      state=2 * hidden, embedding=(vocab, embed), classes=classes, **options)
