"""The op vocabulary of vertex functions (F) and their gradient functions (dF): one table.

Every value in F is a per-vertex row vector (a "vertex symbol" of width w, stored batched as an
(rows, w) dynamic tensor) or a named parameter. Each op's facts sit in one `OpDef` row:

  shape      shape rule: input shapes -> output shape (raises ShapeError with a reason)
  kind       "compute" runs per row range; "view" aliases its input's memory (costs nothing);
             "message" moves memory between vertices or to/from outside F (counted in bytes);
             "reduce" accumulates a parameter gradient over rows (x^T dy, sum of dy)
  expr       elementwise ops only: a scalar expression template used by fusion (fusion.py)
  run        the implementation on one row range, written against the backend (its array
             module `xp` and its `gemm`)
  zero       where the output is known to be zero, from where the vertex inputs are zero
             (support.py skips arithmetic on such rows): "union" = zero where all inputs are,
             "intersect" = zero where any input is, "second" = zero where input 1 is,
             "full" = never known zero (sigmoid(0) = 0.5), "none" = always zero

Gradient rules live in grad.py, keyed by the same names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


class ShapeError(ValueError):
    pass


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str                       # compute | view | message | reduce
    shape: Callable                 # (input shapes, attrs) -> output shape
    run: Callable | None = None     # (backend, out, *inputs) -> None
    expr: str | None = None         # elementwise template over {0}, {1}, ...
    zero: str = "union"             # see the module docstring

    @property
    def elementwise(self) -> bool:
        return self.expr is not None


def _same(shapes, attrs):
    a, b = shapes
    if a == b:
        return a
    raise ShapeError(f"operand widths {a} and {b} differ")


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


def _param(shapes, attrs):
    return attrs["shape"]


def _sink(shapes, attrs):
    return shapes[0]


def _reduce(shapes, attrs):
    return attrs["shape"]


# ---------------------------------------------------------------- implementations (one row range)

def _run_matmul(be, out, x, w):
    be.gemm(out, x, w)


def _run_matmul_t(be, out, dy, w):
    be.gemm(out, dy, w.T)


def _run_add(be, out, a, b):
    be.xp.add(a, b, out=out)


def _run_sub(be, out, a, b):
    be.xp.subtract(a, b, out=out)


def _run_mul(be, out, a, b):
    be.xp.multiply(a, b, out=out)


def _run_neg(be, out, a):
    be.xp.negative(a, out=out)


def _run_sigmoid(be, out, a):
    # 1 / (1 + exp(-a)) without overflow warnings: 0.5 * tanh(a / 2) + 0.5
    be.xp.multiply(a, 0.5, out=out)
    be.xp.tanh(out, out=out)
    be.xp.multiply(out, 0.5, out=out)
    be.xp.add(out, 0.5, out=out)


def _run_tanh(be, out, a):
    be.xp.tanh(a, out=out)


def _run_relu(be, out, a):
    be.xp.maximum(a, 0, out=out)


def _run_sigmoid_grad(be, out, y, dy):   # dy * y * (1 - y)
    be.xp.subtract(1, y, out=out)
    be.xp.multiply(out, y, out=out)
    be.xp.multiply(out, dy, out=out)


def _run_tanh_grad(be, out, y, dy):      # dy * (1 - y^2)
    be.xp.multiply(y, y, out=out)
    be.xp.subtract(1, out, out=out)
    be.xp.multiply(out, dy, out=out)


def _run_relu_grad(be, out, y, dy):
    be.xp.multiply(dy, y > 0, out=out)


def _run_concat(be, out, *parts):
    col = 0
    for p in parts:
        w = p.shape[1]
        out[:, col:col + w] = p
        col += w


def _run_zeros(be, out):
    out.fill(0)


def _run_param_grad(be, out, x, dy):     # dW += x^T dy
    be.gemm(out, x.T, dy, accumulate=True)


def _run_bias_grad(be, out, dy):         # db += sum over rows of dy
    out += dy.sum(axis=0)


OPS: dict[str, OpDef] = {op.name: op for op in [
    # parameters and views (no work at run time)
    OpDef("param", "view", _param),
    OpDef("slice", "view", _slice),
    # message passing: memory moves at F's entry and exit
    OpDef("pull", "message", _width),
    OpDef("gather", "message", _width),
    OpDef("scatter", "message", _sink),
    OpDef("push", "message", _sink),
    # their gradients in dF: gather <-> scatter, pull <-> push
    OpDef("gather_grad_state", "message", _width),  # reads d(state) that parents scattered to this vertex
    OpDef("scatter_grad_child", "message", _sink),  # scatters d(gather(k)) into child k's d(state)
    OpDef("pull_grad_output", "message", _width),   # reads d(loss)/d(push) from outside
    OpDef("push_grad_input", "message", _sink),     # pushes d(pull) out, to the embedding gradient
    # math
    OpDef("matmul", "compute", _matmul, _run_matmul, zero="intersect"),
    OpDef("matmul_t", "compute", _matmul_t, _run_matmul_t, zero="intersect"),
    OpDef("concat", "compute", _concat, _run_concat),
    OpDef("zeros", "compute", _width, _run_zeros, zero="none"),
    OpDef("add", "compute", _same, _run_add, expr="({0} + {1})"),
    OpDef("sub", "compute", _same, _run_sub, expr="({0} - {1})"),
    OpDef("mul", "compute", _same, _run_mul, expr="({0} * {1})", zero="intersect"),
    OpDef("neg", "compute", _unary, _run_neg, expr="(-{0})"),
    OpDef("sigmoid", "compute", _unary, _run_sigmoid, expr="(0.5 * tanh(0.5 * {0}) + 0.5)", zero="full"),
    OpDef("tanh", "compute", _unary, _run_tanh, expr="tanh({0})"),
    OpDef("relu", "compute", _unary, _run_relu, expr="max({0}, 0.0)"),
    OpDef("sigmoid_grad", "compute", _same, _run_sigmoid_grad, expr="({1} * {0} * (1.0 - {0}))", zero="second"),
    OpDef("tanh_grad", "compute", _same, _run_tanh_grad, expr="({1} * (1.0 - {0} * {0}))", zero="second"),
    OpDef("relu_grad", "compute", _same, _run_relu_grad, expr="({1} * ({0} > 0.0))", zero="intersect"),
    # parameter-gradient accumulation over rows
    OpDef("param_grad", "reduce", _reduce, _run_param_grad, zero="intersect"),
    OpDef("bias_grad", "reduce", _reduce, _run_bias_grad),
]}


@dataclass(eq=False)
class Node:
    """One op application in F or dF. `shape` is per vertex (w,) or a parameter's shape."""
    op: str
    inputs: tuple["Node", ...]
    shape: tuple[int, ...]
    attrs: dict = field(default_factory=dict)
    where: str = "?"        # the user's source line that created it (for error messages)
    id: int = -1

    @property
    def is_param(self) -> bool:
        return self.op == "param"

    @property
    def is_vertex(self) -> bool:
        """A per-vertex value that has a dynamic tensor (not a param, not a sink, not a reduction)."""
        return self.op not in ("param", "scatter", "push", "scatter_grad_child", "push_grad_input") \
            and OPS[self.op].kind != "reduce"

    def __repr__(self):
        ins = ", ".join(f"%{i.id}" for i in self.inputs)
        extra = "".join(f" {k}={v}" for k, v in self.attrs.items() if k != "shape")
        return f"%{self.id} = {self.op}({ins}){extra} : {self.shape}"
