"""The child-sum Tree-LSTM of cavs/models/child_sum.py in DyNet with autobatching, from given weights.

The n-ary study (experiments/studies/nary.py) runs it against Cavs. It is DynetSystem (DyNet's
set-up, the parameter interface, the SGD step of docs/workloads.md) with this model's parameters and
vertex function in place of a paper workload's: the parameters are the names and row-convention
shapes of the Cavs model's (`model.init_params()`); samples are n-ary cavs.Graph trees. As a DyNet
user writes it, a vertex loops over its actual children (one forget gate each) and skips the
products with an absent input.
"""
from __future__ import annotations

import numpy as np

from cavs.graphs import levels

from .dynet_autobatch import DynetSystem, pool_mb


class DynetChildSum(DynetSystem):
    name = "dynet-child-sum"
    workloads = ("child_sum",)

    def __init__(self, params: dict[str, np.ndarray], *, batch_size: int, **kwargs):
        self.initial = {name: np.asarray(value, dtype=np.float32) for name, value in params.items()}
        super().__init__("child_sum", hidden=self.initial["Uf"].shape[0], batch_size=batch_size, **kwargs)

    def memory_mb(self) -> int:
        # a vertex holds about as many floats as a binary Tree-LSTM vertex (gates, states, logits)
        return pool_mb("tree_lstm", self.hidden, self.batch_size, self.leaves)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: value.shape for name, value in self.initial.items()}

    def initial_params(self) -> dict[str, np.ndarray]:
        return self.initial

    def prepare(self, graphs):
        """The trees (cavs.Graph), each with its vertices children first."""
        with self.timings.timing("construct_s"):
            return [(g, np.argsort(levels(g.children), kind="stable")) for g in graphs]

    def states(self, g, order, p) -> list:
        dy, H = self.dy, self.hidden
        kids = [[int(c) for c in row if c >= 0] for row in g.children]
        hs, cs = [None] * g.num_vertices, [None] * g.num_vertices
        for v in order:
            tok = int(g.tokens[v])
            x = p["emb"][tok] if tok >= 0 else None
            terms = [p["b"]] + ([p["W"], x] if x is not None else [])
            if kids[v]:
                h_sum = dy.esum([hs[k] for k in kids[v]]) if len(kids[v]) > 1 else hs[kids[v][0]]
                terms += [p["U"], h_sum]
            gates = dy.affine_transform(terms)
            i, o = dy.logistic(dy.pick_range(gates, 0, H)), dy.logistic(dy.pick_range(gates, H, 2 * H))
            u = dy.tanh(dy.pick_range(gates, 2 * H, 3 * H))
            fx = dy.affine_transform([p["bf"], p["Wf"], x]) if x is not None else p["bf"]
            c = [dy.cmult(i, u)]
            for k in kids[v]:                                   # one forget gate per actual child
                c.append(dy.cmult(dy.logistic(dy.affine_transform([fx, p["Uf"], hs[k]])), cs[k]))
            cs[v] = dy.esum(c) if len(c) > 1 else c[0]
            hs[v] = dy.cmult(o, dy.tanh(cs[v]))
        return hs
