"""Tree-FC: a fully connected cell over synthetic complete binary trees."""
import cavs
from cavs import concat, tanh

from . import datasets, workloads


def cell(v, p):
    x = v.pull()                                  # leaf token embedding, zeros inside
    left, right = v.gather(0), v.gather(1)        # children's states (zeros on leaves)
    h = tanh(concat(left, right) @ p.W + x + p.b)
    v.scatter(h)
    v.push(h)


def model(hidden: int, **common) -> cavs.Model:
    h = hidden
    return cavs.Model(cell, {"W": (2 * h, h), "b": (h,)}, arity=2, state=h,
                      embedding=(datasets.TREE_FC_VOCAB, h), classes=datasets.TREE_FC_CLASSES,
                      reader=lambda samples: workloads.to_graphs("tree_fc", samples), name="tree_fc", **common)
