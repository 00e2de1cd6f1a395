"""Traces a user's vertex function once into F: a small static DAG of `ops.Node`s.

The user writes one Python function of the vertex `v` and the parameters `p`:

    def cell(v, p):
        h = cavs.tanh(cavs.concat(*v.gather_all()) @ p.W + v.pull() + p.b)
        v.scatter(h)
        v.push(h)

Tracing runs it once on symbols: every op records a Node with its inferred shape and the
user's source line, so a mistake is reported at trace time as "file:line (op): reason".
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .ops import OPS, Node, ShapeError


class TraceError(ValueError):
    """A mistake in a vertex function found while tracing it; names the user's line and op."""


_CAVS_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_line() -> str:
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_CAVS_DIR) \
            and "/models/" not in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


class Graph:
    """A DAG of nodes under construction (shared by tracing and by gradient derivation)."""

    def __init__(self, first_id: int = 0):
        self.nodes: list[Node] = []
        self.first_id = first_id

    def add(self, op: str, inputs=(), where: str | None = None, **attrs) -> Node:
        where = where or _user_line()
        try:
            shape = OPS[op].shape(tuple(i.shape for i in inputs), attrs)
        except ShapeError as e:
            raise TraceError(f"{where} ({op}): {e}") from None
        node = Node(op, tuple(inputs), tuple(shape), attrs, where, self.first_id + len(self.nodes))
        self.nodes.append(node)
        return node


class Symbol:
    """A traced per-vertex value; Python operators record ops."""
    __array_priority__ = 1000

    def __init__(self, tracer: "Tracer", node: Node):
        self._t, self.node = tracer, node

    @property
    def width(self) -> int:
        return self.node.shape[0]

    def _bin(self, op, other, swap=False):
        other_node = self._t.lift(other, op)
        a, b = (other_node, self.node) if swap else (self.node, other_node)
        if a.is_param:   # keep the vertex operand first so broadcasting of a bias is uniform
            a, b = b, a
        return self._t.wrap(self._t.graph.add(op, (a, b)))

    def __add__(self, o): return self if _is_zero(o) else self._bin("add", o)
    def __radd__(self, o): return self if _is_zero(o) else self._bin("add", o, swap=True)   # sum(...)
    def __sub__(self, o): return self._bin("sub", o)
    def __mul__(self, o): return self._bin("mul", o)
    def __rmul__(self, o): return self._bin("mul", o, swap=True)
    def __neg__(self): return self._t.wrap(self._t.graph.add("neg", (self.node,)))

    def __matmul__(self, w):
        if not isinstance(w, Param):
            raise TraceError(f"{_user_line()} (matmul): the right operand must be a parameter (p.NAME)")
        return self._t.wrap(self._t.graph.add("matmul", (self.node, w.node)))

    def __getitem__(self, item):
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TraceError(f"{_user_line()} (slice): only contiguous slices like s[a:b] are supported")
        start, stop, _ = item.indices(self.width)
        return self._t.wrap(self._t.graph.add("slice", (self.node,), start=start, stop=stop))

    def split(self, parts: int):
        """Splits into `parts` equal slices (e.g. the gates of an LSTM)."""
        if self.width % parts:
            raise TraceError(f"{_user_line()} (split): width {self.width} is not divisible by {parts}")
        w = self.width // parts
        where = _user_line()
        return [self._t.wrap(self._t.graph.add("slice", (self.node,), where, start=i * w, stop=(i + 1) * w))
                for i in range(parts)]

    def __bool__(self):
        raise TraceError(f"{_user_line()}: a vertex function cannot branch on a traced value; "
                         "F must be static")


class Param:
    def __init__(self, node: Node):
        self.node = node

    @property
    def shape(self):
        return self.node.shape

    def __getitem__(self, item):
        raise TraceError(f"{_user_line()} (param): p.{self.node.attrs['name']} cannot be indexed; "
                         "declare the pieces as parameters of their own, or slice a vertex value")


class Params:
    """`p.NAME` inside a vertex function: the named parameters of the model."""

    def __init__(self, tracer, shapes: dict[str, tuple]):
        self._tracer, self._shapes, self._nodes = tracer, shapes, {}

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._shapes:
            raise TraceError(f"{_user_line()}: unknown parameter p.{name}; the model declares "
                             f"{', '.join(self._shapes)}")
        if name not in self._nodes:
            self._nodes[name] = Param(self._tracer.graph.add("param", (), name=name, shape=self._shapes[name]))
        return self._nodes[name]


class Vertex:
    """The `v` argument of a vertex function: the four message ops."""

    def __init__(self, tracer: "Tracer"):
        self._t = tracer

    def gather(self, k: int) -> Symbol:
        """The state that child k scattered (zeros where the vertex has no child k)."""
        t = self._t
        if not isinstance(k, int) or not 0 <= k < t.arity:
            raise TraceError(f"{_user_line()} (gather): child index {k} is beyond the declared arity {t.arity}")
        return t.wrap(t.graph.add("gather", (), k=k, width=t.state_width))

    def gather_all(self) -> list[Symbol]:
        return [self.gather(k) for k in range(self._t.arity)]

    def pull(self) -> Symbol:
        """This vertex's external input (zeros where it has none)."""
        t = self._t
        if t.input_width is None:
            raise TraceError(f"{_user_line()} (pull): this model declares no external input")
        return t.wrap(t.graph.add("pull", (), width=t.input_width))

    def scatter(self, s: Symbol) -> None:
        """Makes `s` this vertex's state, visible to its parents through gather."""
        t = self._t
        node = t.lift(s, "scatter")
        if t.scattered is not None:
            raise TraceError(f"{_user_line()} (scatter): scatter called twice (first at {t.scattered.where})")
        if node.shape != (t.state_width,):
            raise TraceError(f"{_user_line()} (scatter): the state has width {node.shape[0]}, "
                             f"but the model declares state width {t.state_width}")
        t.scattered = t.graph.add("scatter", (node,))

    def push(self, s: Symbol) -> None:
        """Sends `s` outside the structure (to the loss)."""
        t = self._t
        node = t.lift(s, "push")
        if t.pushed is not None:
            raise TraceError(f"{_user_line()} (push): push called twice (first at {t.pushed.where})")
        t.pushed = t.graph.add("push", (node,))


class Tracer:
    def __init__(self, arity, state_width, input_width, param_shapes):
        self.graph = Graph()
        self.arity, self.state_width, self.input_width = arity, state_width, input_width
        self.params = Params(self, param_shapes)
        self.scattered: Node | None = None
        self.pushed: Node | None = None

    def wrap(self, node: Node) -> Symbol:
        return Symbol(self, node)

    def lift(self, value, op: str) -> Node:
        if isinstance(value, (Symbol, Param)):
            return value.node
        raise TraceError(f"{_user_line()} ({op}): expected a traced value or parameter, "
                         f"got {type(value).__name__}")


@dataclass
class VertexFunction:
    """F: the traced DAG plus its interface (arity, state width, input width, parameters used)."""
    nodes: list[Node]
    scatter: Node
    push: Node | None
    arity: int
    state_width: int
    input_width: int | None
    name: str

    def dump(self) -> str:
        return "\n".join(map(repr, self.nodes))


def trace(fn, arity: int, state_width: int, input_width: int | None,
          param_shapes: dict[str, tuple]) -> VertexFunction:
    """Runs `fn(v, p)` once on symbols and returns F; errors name the user's line."""
    t = Tracer(arity, state_width, input_width, param_shapes)
    fn(Vertex(t), t.params)
    if t.scattered is None:
        code = getattr(fn, "__code__", None)
        where = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}" if code else "vertex function"
        raise TraceError(f"{where} ({getattr(fn, '__name__', 'F')}): scatter was never called; "
                         "a vertex function must scatter its state exactly once")
    return VertexFunction(t.graph.nodes, t.scattered, t.pushed, arity, state_width, input_width,
                          getattr(fn, "__name__", "F"))


# free functions used inside vertex functions

def _is_zero(value) -> bool:
    """A literal 0 (Python's sum() starts from it): adding it records no op."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _first_symbol(args) -> Symbol:
    for a in args:
        if isinstance(a, Symbol):
            return a
    raise TraceError(f"{_user_line()}: expected traced values")


def _unary(op):
    def f(x: Symbol) -> Symbol:
        s = _first_symbol([x])
        return s._t.wrap(s._t.graph.add(op, (s.node,)))
    f.__name__ = op
    return f


sigmoid, tanh, relu = _unary("sigmoid"), _unary("tanh"), _unary("relu")


def concat(*parts: Symbol) -> Symbol:
    s = _first_symbol(parts)
    return s._t.wrap(s._t.graph.add("concat", tuple(s._t.lift(p, "concat") for p in parts)))
