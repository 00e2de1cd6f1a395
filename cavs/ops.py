"""The op vocabulary of vertex functions (F) and their gradient functions (dF): one table.

Every value in F is a row vector per vertex, or per edge (child -> vertex), stored batched as a
(rows, width) dynamic tensor, or a named parameter. A value's *domain* says which: "vertex" (one
row per vertex) or "edge" (one row per edge, the edges of a task contiguous and sorted by parent).
Each op's facts sit in one `OpDef` row:

  kind       "compute" runs per row range; "view" aliases its input's memory (costs nothing);
             "message" moves memory between vertices or to/from outside F (counted in bytes);
             "source" is filled per batch or pass before F runs (the degree, a dropout mask);
             "reduce" accumulates a parameter gradient over rows (x^T dy, sum of dy)
  shape      shape rule: (input shapes, attrs) -> output shape (raises ShapeError with a reason)
  domain     "same" (the inputs' common domain), "edge" (a vertex value put on the edges),
             "vertex" (edge values reduced into their parents), or fixed by an attribute
  run        the implementation on one row range: run(backend, out, inputs, attrs), written
             against the backend (its array module `xp`, its `gemm` and its row ops)
  expr       elementwise ops only: a scalar expression over {0}, {1}, ... and the attributes
             ({c}, {p}), from which fusion (fusion.py) writes one kernel per group
  zero       where the output is known to be zero from where the inputs are (support.py skips
             arithmetic on such rows): "union" = zero where all inputs are, "intersect" = where
             any input is, "first" / "second" = where that input is, "full" = never known zero
             (sigmoid(0) = 0.5), "none" = always zero; or a function of the attributes

Elementwise binary ops broadcast a width-1 operand over the other's width (attention weights over
a state). Gradient rules live in grad.py, keyed by the same names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


class ShapeError(ValueError):
    pass


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str                       # compute | view | message | source | reduce
    shape: Callable                 # (input shapes, attrs) -> output shape
    run: Callable | None = None     # (backend, out, inputs, attrs) -> None
    expr: str | None = None         # elementwise template over {0}, {1}, ... and {attr}
    zero: str | Callable = "union"  # see the module docstring
    domain: str = "same"            # same | edge | vertex | attr (attrs["domain"], default vertex)

    @property
    def elementwise(self) -> bool:
        return self.expr is not None

    def zero_rule(self, attrs) -> str:
        return self.zero(attrs) if callable(self.zero) else self.zero


# ---------------------------------------------------------------- shape rules

def _elementwise(shapes, attrs):
    """Equal widths, or a width-1 operand broadcast over the other's width."""
    widths = {s[0] for s in shapes}
    if len(shapes) != 2 or len(shapes[0]) != 1 or len(shapes[1]) != 1:
        raise ShapeError(f"operands of shapes {shapes[0]} and {shapes[1]} are not both row vectors")
    if len(widths) == 1 or 1 in widths:
        return (max(widths),)
    a, b = shapes
    raise ShapeError(f"operand widths {a[0]} and {b[0]} differ (one may be 1, broadcast over the other)")


def _unary(shapes, attrs):
    return shapes[0]


def _matmul(shapes, attrs):
    x, w = shapes
    if len(w) != 2 or x[0] != w[0]:
        raise ShapeError(f"cannot multiply a vertex vector of width {x[0]} by a parameter of shape {w}")
    return (w[1],)


def _matmul_t(shapes, attrs):
    dy, w = shapes
    if dy[0] != w[1]:
        raise ShapeError(f"cannot multiply width {dy[0]} by the transpose of {w}")
    return (w[0],)


def _concat(shapes, attrs):
    return (sum(s[0] for s in shapes),)


def _slice(shapes, attrs):
    start, stop = attrs["start"], attrs["stop"]
    if not 0 <= start < stop <= shapes[0][0]:
        raise ShapeError(f"slice [{start}:{stop}] outside width {shapes[0][0]}")
    return (stop - start,)


def _width(shapes, attrs):
    return (attrs["width"],)


def _one(shapes, attrs):
    return (1,)


def _param(shapes, attrs):
    return attrs["shape"]


def _reduce(shapes, attrs):
    return attrs["shape"]


# ---------------------------------------------------------------- implementations (one row range)

def _run_matmul(be, out, ins, attrs):
    be.gemm(out, ins[0], ins[1])


def _run_matmul_t(be, out, ins, attrs):
    be.gemm(out, ins[0], ins[1].T)


def _ufunc(name):
    def run(be, out, ins, attrs):
        getattr(be.xp, name)(*ins, out=out)
    return run


def _run_scale(be, out, ins, attrs):
    be.xp.multiply(ins[0], attrs["c"], out=out)


def _run_shift(be, out, ins, attrs):
    be.xp.add(ins[0], attrs["c"], out=out)


def _run_power(be, out, ins, attrs):
    be.xp.power(ins[0], attrs["p"], out=out)


def _run_max_const(be, out, ins, attrs):
    be.xp.maximum(ins[0], attrs["c"], out=out)


def _run_min_const(be, out, ins, attrs):
    be.xp.minimum(ins[0], attrs["c"], out=out)


def _mask(compare, second=None):
    """An elementwise 0/1 value: compare(x, y) as the dtype of `out`."""
    def run(be, out, ins, attrs):
        other = ins[1] if second is None else attrs[second]
        out[...] = compare(be.xp, ins[0], other)
    return run


def _run_sigmoid(be, out, ins, attrs):
    # 1 / (1 + exp(-a)) without overflow warnings: 0.5 * tanh(a / 2) + 0.5
    be.xp.multiply(ins[0], 0.5, out=out)
    be.xp.tanh(out, out=out)
    be.xp.multiply(out, 0.5, out=out)
    be.xp.add(out, 0.5, out=out)


def _run_relu(be, out, ins, attrs):
    be.xp.maximum(ins[0], 0, out=out)


def _run_sigmoid_grad(be, out, ins, attrs):   # dy * y * (1 - y)
    y, dy = ins
    be.xp.subtract(1, y, out=out)
    be.xp.multiply(out, y, out=out)
    be.xp.multiply(out, dy, out=out)


def _run_tanh_grad(be, out, ins, attrs):      # dy * (1 - y^2)
    y, dy = ins
    be.xp.multiply(y, y, out=out)
    be.xp.subtract(1, out, out=out)
    be.xp.multiply(out, dy, out=out)


def _run_relu_grad(be, out, ins, attrs):
    y, dy = ins
    be.xp.multiply(dy, y > 0, out=out)


def _run_expand(be, out, ins, attrs):
    out[...] = ins[0]


def _run_feature_sum(be, out, ins, attrs):
    ins[0].sum(axis=1, keepdims=True, out=out)


def _run_concat(be, out, ins, attrs):
    col = 0
    for p in ins:
        w = p.shape[1]
        out[:, col:col + w] = p
        col += w


def _run_zeros(be, out, ins, attrs):
    out.fill(0)


def _run_param_grad(be, out, ins, attrs):     # dW += x^T dy
    be.gemm(out, ins[0].T, ins[1], accumulate=True)


def _run_bias_grad(be, out, ins, attrs):      # db += sum over rows of dy
    out += ins[0].sum(axis=0)


def _power_zero(attrs):
    return "union" if attrs["p"] > 0 else "full"


def _const_zero(value_at_zero):
    """Known zero where the input is, when the op maps 0 to 0."""
    return lambda attrs: "union" if value_at_zero(attrs["c"]) == 0 else "full"


OPS: dict[str, OpDef] = {op.name: op for op in [
    # parameters and views (no work at run time)
    OpDef("param", "view", _param, domain="attr"),
    OpDef("slice", "view", _slice),
    # message passing: memory moves at F's entry and exit
    OpDef("pull", "message", _width, domain="attr"),
    OpDef("gather", "message", _width, domain="attr"),       # child k's state (positional)
    OpDef("child_state", "message", _width, domain="attr"),  # every child's state, one row per edge
    OpDef("scatter", "message", _unary),
    OpDef("push", "message", _unary),
    # their gradients in dF: gather <-> scatter, pull <-> push
    OpDef("gather_grad_state", "message", _width, domain="attr"),  # d(state) the parents scattered back
    OpDef("scatter_grad_child", "message", _unary),   # d(gather(k)) into child k's d(state)
    OpDef("child_state_grad", "message", _unary),     # d(child_state) into each edge's child's d(state)
    OpDef("pull_grad_output", "message", _width, domain="attr"),   # d(loss)/d(push) from outside
    OpDef("push_grad_input", "message", _unary),      # d(pull) out, to the embedding gradient
    # filled before F runs: each vertex's number of children, a dropout mask
    OpDef("num_children", "source", _one, zero="full", domain="attr"),
    OpDef("dropout_mask", "source", _width, zero="full", domain="attr"),
    # edges and vertices (engine.py implements them with the backend's row ops)
    OpDef("broadcast", "compute", _unary, domain="edge"),        # a vertex value on each of its edges
    OpDef("edge_sum", "compute", _unary, domain="vertex"),       # edges reduced into their parent
    OpDef("edge_max", "compute", _unary, domain="vertex"),
    OpDef("edge_softmax", "compute", _unary, zero="full"),       # normalised over each parent's edges
    # products
    OpDef("matmul", "compute", _matmul, _run_matmul, zero="intersect"),
    OpDef("matmul_t", "compute", _matmul_t, _run_matmul_t, zero="intersect"),
    # copies
    OpDef("concat", "compute", _concat, _run_concat),
    OpDef("zeros", "compute", _width, _run_zeros, zero="none", domain="attr"),
    OpDef("expand", "compute", _width, _run_expand, expr="{0}"),         # width 1 -> width
    OpDef("feature_sum", "compute", _one, _run_feature_sum),            # over the feature axis
    # elementwise arithmetic
    OpDef("add", "compute", _elementwise, _ufunc("add"), expr="({0} + {1})"),
    OpDef("sub", "compute", _elementwise, _ufunc("subtract"), expr="({0} - {1})"),
    OpDef("mul", "compute", _elementwise, _ufunc("multiply"), expr="({0} * {1})", zero="intersect"),
    OpDef("div", "compute", _elementwise, _ufunc("divide"), expr="({0} / {1})", zero="first"),
    OpDef("maximum", "compute", _elementwise, _ufunc("maximum"), expr="max({0}, {1})"),
    OpDef("minimum", "compute", _elementwise, _ufunc("minimum"), expr="min({0}, {1})"),
    OpDef("neg", "compute", _unary, _ufunc("negative"), expr="(-{0})"),
    OpDef("scale", "compute", _unary, _run_scale, expr="({0} * {c})"),
    OpDef("shift", "compute", _unary, _run_shift, expr="({0} + {c})", zero="full"),
    OpDef("power", "compute", _unary, _run_power, expr="pow({0}, {p})", zero=_power_zero),
    OpDef("max_const", "compute", _unary, _run_max_const, expr="max({0}, {c})", zero=_const_zero(lambda c: max(0, c))),
    OpDef("min_const", "compute", _unary, _run_min_const, expr="min({0}, {c})", zero=_const_zero(lambda c: min(0, c))),
    OpDef("exp", "compute", _unary, _ufunc("exp"), expr="exp({0})", zero="full"),
    OpDef("log", "compute", _unary, _ufunc("log"), expr="log({0})", zero="full"),
    OpDef("abs", "compute", _unary, _ufunc("abs"), expr="abs({0})"),
    OpDef("sign", "compute", _unary, _ufunc("sign"), expr="((0.0 < {0}) * 1.0 - ({0} < 0.0) * 1.0)"),
    OpDef("sigmoid", "compute", _unary, _run_sigmoid, expr="(0.5 * tanh(0.5 * {0}) + 0.5)", zero="full"),
    OpDef("tanh", "compute", _unary, _ufunc("tanh"), expr="tanh({0})"),
    OpDef("relu", "compute", _unary, _run_relu, expr="max({0}, 0.0)"),
    # 0/1 masks (inside gradients: where maximum, max_const and edge_max pass their gradient)
    OpDef("ge", "compute", _elementwise, _mask(lambda xp, a, b: a >= b), expr="(({0} >= {1}) * 1.0)", zero="full"),
    OpDef("eq", "compute", _elementwise, _mask(lambda xp, a, b: a == b), expr="(({0} == {1}) * 1.0)", zero="full"),
    OpDef("gt_const", "compute", _unary, _mask(lambda xp, a, c: a > c, "c"), expr="(({0} > {c}) * 1.0)",
          zero=_const_zero(lambda c: float(0 > c))),
    OpDef("lt_const", "compute", _unary, _mask(lambda xp, a, c: a < c, "c"), expr="(({0} < {c}) * 1.0)",
          zero=_const_zero(lambda c: float(0 < c))),
    # activation gradients, from the output y and the incoming dy
    OpDef("sigmoid_grad", "compute", _elementwise, _run_sigmoid_grad, expr="({1} * {0} * (1.0 - {0}))", zero="second"),
    OpDef("tanh_grad", "compute", _elementwise, _run_tanh_grad, expr="({1} * (1.0 - {0} * {0}))", zero="second"),
    OpDef("relu_grad", "compute", _elementwise, _run_relu_grad, expr="({1} * ({0} > 0.0))", zero="intersect"),
    # parameter-gradient accumulation over rows
    OpDef("param_grad", "reduce", _reduce, _run_param_grad, zero="intersect"),
    OpDef("bias_grad", "reduce", _reduce, _run_bias_grad),
]}

# the sinks of F and dF: they write outside their own dynamic tensor (a parent's state, the head, a
# child's state gradient, the embedding gradient) and have none of their own
SINKS = ("scatter", "push", "scatter_grad_child", "child_state_grad", "push_grad_input")


@dataclass(eq=False)
class Node:
    """One op application in F or dF. `shape` is per row (w,) or a parameter's shape; `domain` is
    "vertex" or "edge" (None for a parameter)."""
    op: str
    inputs: tuple["Node", ...]
    shape: tuple[int, ...]
    attrs: dict = field(default_factory=dict)
    where: str = "?"        # the user's source line that created it (for error messages)
    id: int = -1
    domain: str | None = "vertex"

    @property
    def is_param(self) -> bool:
        return self.op == "param"

    @property
    def on_edges(self) -> bool:
        return self.domain == "edge"

    @property
    def has_rows(self) -> bool:
        """A per-row value that has a dynamic tensor (not a param, not a sink, not a reduction)."""
        return self.op != "param" and self.op not in SINKS and OPS[self.op].kind != "reduce"

    def __repr__(self):
        ins = ", ".join(f"%{i.id}" for i in self.inputs)
        extra = "".join(f" {k}={v}" for k, v in self.attrs.items() if k != "shape")
        where = "" if self.domain in ("vertex", None) else f" [{self.domain}]"
        return f"%{self.id} = {self.op}({ins}){extra} : {self.shape}{where}"
