"""Derives the gradient function dF from F symbolically, with one table of gradient rules.

dF is another static DAG of the same op vocabulary; it may read F's values (they stay in their
dynamic tensors). Its seeds are the message ops' duals: the state gradient that the parents
scattered back (`gather_grad_state`, the dual of scatter) and the loss gradient of the pushed
output (`pull_grad_output`, the dual of push). Its sinks are `scatter_grad_child` (the dual of
gather: sends d(state) to child k), `push_grad_input` (the dual of pull: d(input) out to the
embedding) and the parameter-gradient reductions. Contributions to one value accumulate (a
value used twice, a DAG vertex with two parents, a parameter used in two places).
"""
from __future__ import annotations

from dataclasses import dataclass

from .ops import Node
from .vertex import Graph, TraceError, VertexFunction


def _add(g, n, dy, give):
    for i in (0, 1):
        give(n.inputs[i], dy)


def _sub(g, n, dy, give):
    give(n.inputs[0], dy)
    give(n.inputs[1], g.add("neg", (dy,), n.where))


def _mul(g, n, dy, give):
    a, b = n.inputs
    give(a, g.add("mul", (dy, b), n.where))
    give(b, g.add("mul", (dy, a), n.where))


def _neg(g, n, dy, give):
    give(n.inputs[0], g.add("neg", (dy,), n.where))


def _activation(grad_op):
    def rule(g, n, dy, give):
        give(n.inputs[0], g.add(grad_op, (n, dy), n.where))   # uses the output y, not the input
    return rule


def _matmul(g, n, dy, give):
    x, w = n.inputs
    give(x, g.add("matmul_t", (dy, w), n.where))
    g.add("param_grad", (x, dy), n.where, shape=w.shape, param=w.attrs["name"])   # dW += x^T dy


def _concat(g, n, dy, give):
    col = 0
    for part in n.inputs:
        width = part.shape[0]
        give(part, g.add("slice", (dy,), n.where, start=col, stop=col + width))
        col += width


def _slice(g, n, dy, give):
    give(n.inputs[0], dy, (n.attrs["start"], n.attrs["stop"]))


def _gather(g, n, dy, give):
    g.add("scatter_grad_child", (dy,), n.where, k=n.attrs["k"])


def _pull(g, n, dy, give):
    g.add("push_grad_input", (dy,), n.where)


GRADIENT_RULES = {
    "add": _add, "sub": _sub, "mul": _mul, "neg": _neg,
    "sigmoid": _activation("sigmoid_grad"), "tanh": _activation("tanh_grad"),
    "relu": _activation("relu_grad"),
    "matmul": _matmul, "concat": _concat, "slice": _slice,
    "gather": _gather, "pull": _pull,
}


@dataclass
class GradientFunction:
    """dF: nodes in execution order; reads F's nodes as inputs where a rule needs a forward value."""
    nodes: list[Node]

    def dump(self) -> str:
        return "\n".join(map(repr, self.nodes))


def derive(F: VertexFunction) -> GradientFunction:
    g = Graph(first_id=len(F.nodes))     # ids continue F's, so a dump reads as one program
    full: dict[Node, list[Node]] = {}
    parts: dict[Node, list[tuple[int, int, Node]]] = {}

    def give(x: Node, dy: Node, cols: tuple[int, int] | None = None):
        if x.is_param:
            # a bias (added/subtracted/scaled per row): its gradient is the sum over rows
            g.add("bias_grad", (dy,), dy.where, shape=x.shape, param=x.attrs["name"])
        elif cols is None:
            full.setdefault(x, []).append(dy)
        else:
            parts.setdefault(x, []).append((*cols, dy))

    give(F.scatter.inputs[0], g.add("gather_grad_state", (), F.scatter.where, width=F.state_width))
    if F.push is not None:
        pushed = F.push.inputs[0]
        give(pushed, g.add("pull_grad_output", (), F.push.where, width=pushed.shape[0]))

    for node in reversed(F.nodes):
        if node.op in ("scatter", "push", "param"):
            continue
        dy = _total(g, node, full.get(node, []), parts.get(node, []))
        if dy is None:
            continue                      # does not influence the loss or the state
        rule = GRADIENT_RULES.get(node.op)
        if rule is None:
            raise TraceError(f"{node.where} ({node.op}): no gradient rule for op '{node.op}'")
        rule(g, node, dy, give)
    return GradientFunction(g.nodes)


def _total(g: Graph, x: Node, full: list[Node], parts: list[tuple[int, int, Node]]) -> Node | None:
    """Sums the gradient contributions to x: whole-width ones, and column ranges (from slices)."""
    terms = list(full)
    if parts:
        width = x.shape[0]
        parts = sorted(parts, key=lambda p: p[0])
        disjoint = all(a[1] <= b[0] for a, b in zip(parts, parts[1:]))
        groups = [parts] if disjoint else [[p] for p in parts]
        for group in groups:     # each group becomes one full-width term, zero-filled in the gaps
            pieces, col = [], 0
            for start, stop, dy in group:
                if start > col:
                    pieces.append(g.add("zeros", (), x.where, width=start - col))
                pieces.append(dy)
                col = stop
            if col < width:
                pieces.append(g.add("zeros", (), x.where, width=width - col))
            terms.append(pieces[0] if len(pieces) == 1 else g.add("concat", tuple(pieces), x.where))
    if not terms:
        return None
    total = terms[0]
    for t in terms[1:]:
        total = g.add("add", (total, t), x.where)
    return total
