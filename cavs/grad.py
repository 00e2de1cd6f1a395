"""Derives the gradient function dF from F symbolically, with one table of gradient rules.

dF is another static DAG of the same op vocabulary; it may read F's values (they stay in their
dynamic tensors). Its seeds are the message ops' duals: the state gradient that the parents
scattered back (`gather_grad_state`, the dual of scatter) and the loss gradient of the pushed
output (`pull_grad_output`, the dual of push). Its sinks are `scatter_grad_child` (the dual of a
positional gather: sends d(state) to child k), `child_state_grad` (the dual of children().state:
each edge's gradient scatter-added into its child's d(state)), `push_grad_input` (the dual of
pull: d(input) out to the embedding) and the parameter-gradient reductions. On edges, `broadcast`
and `edge_sum` are each other's transposes. Contributions to one value accumulate (a value used
twice, a DAG vertex with two parents, a parameter used in two places); a width-1 operand that an
op broadcast over a wider one receives the sum of its contributions over the feature axis.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ops import Node
from .vertex import Program, TraceError, VertexFunction


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


def _div(g, n, dy, give):                  # y = a / b: da = dy / b, db = -dy * y / b
    a, b = n.inputs
    give(a, g.add("div", (dy, b), n.where))
    give(b, g.add("neg", (g.add("div", (g.add("mul", (dy, n), n.where), b), n.where),), n.where))


def _neg(g, n, dy, give):
    give(n.inputs[0], g.add("neg", (dy,), n.where))


def _scale(g, n, dy, give):
    give(n.inputs[0], g.add("scale", (dy,), n.where, c=n.attrs["c"]))


def _shift(g, n, dy, give):
    give(n.inputs[0], dy)


def _power(g, n, dy, give):                # d x^p = p x^(p-1) dx
    x, p = n.inputs[0], n.attrs["p"]
    slope = g.add("scale", (g.add("power", (x,), n.where, p=p - 1),), n.where, c=p) if p != 1 else None
    give(x, dy if slope is None else g.add("mul", (dy, slope), n.where))


def _exp(g, n, dy, give):
    give(n.inputs[0], g.add("mul", (dy, n), n.where))        # uses the output y = exp(x)


def _log(g, n, dy, give):
    give(n.inputs[0], g.add("div", (dy, n.inputs[0]), n.where))


def _abs(g, n, dy, give):
    give(n.inputs[0], g.add("mul", (dy, g.add("sign", (n.inputs[0],), n.where)), n.where))


def _extremum(first_wins):
    """maximum / minimum: the gradient goes to the operand that was taken (ties: the first)."""
    def rule(g, n, dy, give):
        a, b = n.inputs
        taken = g.add("ge", (a, b) if first_wins else (b, a), n.where)             # 1 where a is taken
        give(a, g.add("mul", (dy, taken), n.where))
        give(b, g.add("sub", (dy, g.add("mul", (dy, taken), n.where)), n.where))
    return rule


def _extremum_const(mask_op):
    def rule(g, n, dy, give):
        x = n.inputs[0]
        give(x, g.add("mul", (dy, g.add(mask_op, (x,), n.where, c=n.attrs["c"])), n.where))
    return rule


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


def _expand(g, n, dy, give):
    give(n.inputs[0], g.add("feature_sum", (dy,), n.where))


def _feature_sum(g, n, dy, give):
    give(n.inputs[0], g.add("expand", (dy,), n.where, width=n.inputs[0].shape[0]))


def _broadcast(g, n, dy, give):
    give(n.inputs[0], g.add("edge_sum", (dy,), n.where))


def _edge_sum(g, n, dy, give):
    give(n.inputs[0], g.add("broadcast", (dy,), n.where))


def _edge_max(g, n, dy, give):
    """To the edges that hold the maximum, split evenly among ties (as torch.amax)."""
    x = n.inputs[0]
    held = g.add("eq", (x, g.add("broadcast", (n,), n.where)), n.where)
    share = g.add("div", (dy, g.add("edge_sum", (held,), n.where)), n.where)
    give(x, g.add("mul", (g.add("broadcast", (share,), n.where), held), n.where))


def _edge_softmax(g, n, dy, give):         # a = softmax(s): ds = a * (da - sum over the edges of a * da)
    weighted = g.add("mul", (n, dy), n.where)
    total = g.add("broadcast", (g.add("edge_sum", (weighted,), n.where),), n.where)
    give(n.inputs[0], g.add("mul", (n, g.add("sub", (dy, total), n.where)), n.where))


def _gather(g, n, dy, give):
    g.add("scatter_grad_child", (dy,), n.where, k=n.attrs["k"])


def _child_state(g, n, dy, give):
    g.add("child_state_grad", (dy,), n.where)


def _pull(g, n, dy, give):
    g.add("push_grad_input", (dy,), n.where)


def _constant(g, n, dy, give):
    """No gradient: the degree and the dropout mask are data, not functions of the parameters."""


GRADIENT_RULES = {
    "add": _add, "sub": _sub, "mul": _mul, "div": _div, "neg": _neg,
    "scale": _scale, "shift": _shift, "power": _power, "exp": _exp, "log": _log, "abs": _abs,
    "maximum": _extremum(True), "minimum": _extremum(False),
    "max_const": _extremum_const("gt_const"), "min_const": _extremum_const("lt_const"),
    "sigmoid": _activation("sigmoid_grad"), "tanh": _activation("tanh_grad"),
    "relu": _activation("relu_grad"),
    "matmul": _matmul, "concat": _concat, "slice": _slice,
    "expand": _expand, "feature_sum": _feature_sum,
    "broadcast": _broadcast, "edge_sum": _edge_sum, "edge_max": _edge_max, "edge_softmax": _edge_softmax,
    "gather": _gather, "child_state": _child_state, "pull": _pull,
    "num_children": _constant, "dropout_mask": _constant,
}


@dataclass
class GradientFunction:
    """dF: nodes in execution order; reads F's nodes as inputs where a rule needs a forward value."""
    nodes: list[Node]

    def dump(self) -> str:
        return "\n".join(map(repr, self.nodes))


def derive(F: VertexFunction) -> GradientFunction:
    g = Program(first_id=len(F.nodes))   # ids continue F's, so a dump reads as one program
    full: dict[Node, list[Node]] = {}
    parts: dict[Node, list[tuple[int, int, Node]]] = {}

    def give(x: Node, dy: Node, cols: tuple[int, int] | None = None):
        if x.is_param:
            # a bias (added/subtracted/scaled per row): its gradient is the sum over rows
            g.add("bias_grad", (dy,), dy.where, shape=x.shape, param=x.attrs["name"])
            return
        if x.shape[0] == 1 and dy.shape[0] > 1:      # x was broadcast over the feature axis
            dy = g.add("feature_sum", (dy,), dy.where)
        if cols is None:
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


def _total(g: Program, x: Node, full: list[Node], parts: list[tuple[int, int, Node]]) -> Node | None:
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
                    pieces.append(g.add("zeros", (), x.where, width=start - col, domain=x.domain))
                pieces.append(dy)
                col = stop
            if col < width:
                pieces.append(g.add("zeros", (), x.where, width=width - col, domain=x.domain))
            terms.append(pieces[0] if len(pieces) == 1 else g.add("concat", tuple(pieces), x.where))
    if not terms:
        return None
    total = terms[0]
    for t in terms[1:]:
        total = g.add("add", (total, t), x.where)
    return total
