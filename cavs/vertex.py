"""Traces a user's vertex function once into F: a small static DAG of `ops.Node`s.

The user writes one Python function of the vertex `v` and the parameters `p`:

    def cell(v, p):                                   # child-sum Tree-LSTM, any number of children
        x = v.pull()
        kids = v.children()                           # one row per edge (child -> this vertex)
        h_k, c_k = kids.state.split(2)                # what each child scattered
        i, o, u = (x @ p.W + h_k.sum() @ p.U + p.b).split(3)
        f_k = sigmoid(kids.broadcast(x @ p.Wf + p.bf) + h_k @ p.Uf)
        c = sigmoid(i) * tanh(u) + (f_k * c_k).sum()
        h = sigmoid(o) * tanh(c)
        v.scatter(concat(h, c)); v.push(h)

Values are per vertex, or per edge (what `children()` gives, and what `kids.broadcast(x)` makes of
a vertex value); the same math applies to both, and `e.sum()`, `e.mean()`, `e.max()` and
`kids.softmax(e)` go from edges to vertices. Positional `v.gather(k)` reads child slot k, for models
whose children play fixed roles (a binary tree's left and right). Tracing runs the function once
on symbols: every op records a Node with its inferred shape and domain and the user's source line,
so a mistake is reported at trace time as "file:line (op): reason" -- including branching on a
traced value, comparing one, or calling a NumPy function on one.
"""
from __future__ import annotations

import math
import numbers
import os
import sys
from dataclasses import dataclass

import numpy as np

from .graphs import whole
from .ops import OPS, Node, ShapeError


class TraceError(ValueError):
    """A mistake in a vertex function found while tracing it; names the user's line and op."""


class UnknownAttributeError(TraceError, AttributeError):
    """A traced value has no such attribute (an AttributeError too, so that hasattr() still works)."""


_CAVS_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_line() -> str:
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_CAVS_DIR) \
            and "/models/" not in frame.f_code.co_filename:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


class Program:
    """The DAG of nodes under construction (tracing F, and deriving dF from it)."""

    def __init__(self, first_id: int = 0):
        self.nodes: list[Node] = []
        self.first_id = first_id

    def add(self, op: str, inputs=(), where: str | None = None, **attrs) -> Node:
        where = where or _user_line()
        try:
            shape = OPS[op].shape(tuple(i.shape for i in inputs), attrs)
        except ShapeError as e:
            raise TraceError(f"{where} ({op}): {e}") from None
        node = Node(op, tuple(inputs), tuple(shape), attrs, where, self.first_id + len(self.nodes),
                    _domain(op, inputs, attrs, where))
        self.nodes.append(node)
        return node


def _domain(op: str, inputs, attrs, where) -> str | None:
    """The output's domain (vertex / edge) from the op's rule and its inputs' domains."""
    rule = OPS[op].domain
    if rule == "attr":
        return None if op == "param" else attrs.get("domain", "vertex")
    domains = {i.domain for i in inputs if not i.is_param}
    if rule == "edge":                                       # broadcast: vertex -> edge
        if not domains:                                      # a parameter or a constant
            raise TraceError(f"{where} ({op}): kids.broadcast(x) takes a per-vertex value, got a parameter; "
                             "a parameter needs no broadcast: use it in the per-edge math as it is")
        if domains != {"vertex"}:
            raise TraceError(f"{where} ({op}): kids.broadcast(x) takes a per-vertex value, got a per-edge one")
        return "edge"
    if rule == "vertex":                                     # reductions: edge -> vertex
        if domains != {"edge"}:
            raise TraceError(f"{where} ({op}): .sum(), .mean() and .max() reduce a per-edge value (from "
                             "v.children()) into its vertex; for the feature axis use cavs.feature_sum(h)")
        return "vertex"
    if len(domains) > 1:
        raise TraceError(f"{where} ({op}): mixes a per-vertex value and a per-edge value; put the vertex "
                         "value on the edges with kids.broadcast(x), or reduce the edges with .sum()")
    return domains.pop() if domains else "vertex"


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _constant(value, op: str) -> float | None:
    """A Python (or NumPy) number as the float an op carries; None for anything else. A constant
    that is not finite (nan, inf, an int past a float's range) would make every vertex's value NaN
    or inf in silence, so it is refused, naming the line."""
    if not _number(value):
        return None
    try:
        c = float(value)
    except OverflowError:
        c = math.inf
    if not math.isfinite(c):
        shown = repr(value) if len(repr(value)) <= 24 else f"{repr(value)[:12]}... ({len(repr(value))} digits)"
        raise TraceError(f"{_user_line()} ({op}): the constant {shown} is not a finite number")
    return c


def _no_attribute(shown: str, what: str, has: str, own=("_t",)):
    """__getattr__ for a name not found the normal way: a TraceError (an AttributeError too, so
    that hasattr() still works) naming it, the line and what there is (`what` carries its verb:
    "a vertex has"); Python's own protocols (dunders) and the object's own fields keep their plain
    AttributeError."""
    def missing(self, name):
        if name.startswith("__") or name in own:
            raise AttributeError(name)
        raise UnknownAttributeError(f"{_user_line()} ({shown}{name}): {what} no attribute {name!r}; {has}")
    return missing


def _not_an_op(text: str, advice: str):
    """An operator Python offers that vertex functions do not: a TraceError naming it and the line
    (not Python's TypeError about a Symbol)."""
    def refuse(self, *_):
        raise TraceError(f"{_user_line()} ({text}): not an op of vertex functions; {advice}")
    return refuse


class Symbol:
    """A traced per-vertex or per-edge value; Python operators record ops."""
    __array_priority__ = 1000
    __hash__ = object.__hash__

    def __init__(self, tracer: "Tracer", node: Node):
        self._t, self.node = tracer, node

    @property
    def width(self) -> int:
        return self.node.shape[0]

    def _op(self, op, inputs, **attrs) -> "Symbol":
        return self._t.wrap(self._t.program.add(op, tuple(inputs), **attrs))

    def _bin(self, op, other, swap=False):
        other_node = self._t.lift(other, op)
        a, b = (other_node, self.node) if swap else (self.node, other_node)
        if a.is_param and op in ("add", "mul"):    # keep the row value first so a bias broadcasts uniformly
            a, b = b, a
        return self._op(op, (a, b))

    # arithmetic with another value or a Python number
    def __add__(self, o):
        c = _constant(o, "add")
        if c is not None:
            return self if c == 0 else self._op("shift", (self.node,), c=c)
        return self._bin("add", o)

    __radd__ = __add__                          # sum(...) starts from 0

    def __sub__(self, o):
        c = _constant(o, "sub")
        if c is not None:
            return self if c == 0 else self._op("shift", (self.node,), c=-c)
        return self._bin("sub", o)

    def __rsub__(self, o):
        c = _constant(o, "sub")
        if c is not None:
            negated = self._op("neg", (self.node,))
            return negated if c == 0 else negated._op("shift", (negated.node,), c=c)
        return self._bin("sub", o, swap=True)

    def __mul__(self, o):
        c = _constant(o, "mul")
        if c is not None:
            return self if c == 1 else self._op("scale", (self.node,), c=c)
        return self._bin("mul", o)

    __rmul__ = __mul__

    def __truediv__(self, o):
        c = _constant(o, "div")
        if c is not None:
            if c == 0:
                raise TraceError(f"{_user_line()} (div): division by the constant 0")
            return self if c == 1 else self._op("scale", (self.node,), c=1.0 / c)
        return self._bin("div", o)

    def __rtruediv__(self, o):
        c = _constant(o, "div")
        if c is not None:
            inverse = self._op("power", (self.node,), p=-1.0)
            return inverse if c == 1 else inverse._op("scale", (inverse.node,), c=c)
        return self._bin("div", o, swap=True)

    def __pow__(self, p):
        c = _constant(p, "power")
        if c is None:
            raise TraceError(f"{_user_line()} (power): the exponent must be a Python number, got "
                             f"{type(p).__name__}; for x ** y write cavs.exp(y * cavs.log(x))")
        return self if c == 1 else self._op("power", (self.node,), p=c)

    def __rpow__(self, base):
        raise TraceError(f"{_user_line()} (power): a number raised to a traced value is not an op; "
                         "write cavs.exp(x * math.log(base))")

    def __neg__(self):
        return self._op("neg", (self.node,))

    def __pos__(self):
        return self

    def __abs__(self):
        return self._op("abs", (self.node,))

    def __matmul__(self, w):
        if not isinstance(w, Param):
            raise TraceError(f"{_user_line()} (matmul): the right operand must be a parameter (p.NAME)")
        return self._op("matmul", (self.node, w.node))

    def __rmatmul__(self, w):
        name = f"p.{w.node.attrs['name']}" if isinstance(w, Param) else type(w).__name__
        raise TraceError(f"{_user_line()} (matmul): {name} @ value is not an op; a vertex value is a row vector, "
                         f"so write value @ {name if isinstance(w, Param) else 'p.NAME'} (declare the parameter "
                         "transposed if need be)")

    # Python operators that are not ops: named, with what to write instead
    __floordiv__ = __rfloordiv__ = _not_an_op("//", "values stay real: use / (there is no floor division)")
    __mod__ = __rmod__ = __divmod__ = __rdivmod__ = _not_an_op("%", "values stay real: there is no remainder op")
    __round__ = __trunc__ = __floor__ = __ceil__ = _not_an_op("rounding", "values stay real: there is no rounding "
                                                                          "op")
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __invert__ = _not_an_op(
        "&, |, ^, ~", "F is static; for a mask multiply by a value in [0, 1] (cavs.sigmoid, cavs.maximum)")
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _not_an_op("<<, >>", "values are real, not bits")

    def __getitem__(self, item):
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TraceError(f"{_user_line()} (slice): only contiguous slices like s[a:b] are supported")
        w, shown = self.width, f"[{'' if item.start is None else item.start}:{'' if item.stop is None else item.stop}]"
        for bound in (item.start, item.stop):
            if bound is not None and not whole(bound):
                raise TraceError(f"{_user_line()} (slice): {shown}: the bounds must be whole numbers")
            if bound is not None and not -w <= bound <= w:     # NumPy would clip it in silence
                raise TraceError(f"{_user_line()} (slice): {shown} reaches past the value's width {w}")
        start, stop, _ = item.indices(w)
        if stop <= start:
            raise TraceError(f"{_user_line()} (slice): {shown} of a value of width {w} is empty")
        return self._op("slice", (self.node,), start=start, stop=stop)

    def split(self, parts: int):
        """Splits into `parts` equal slices (e.g. the gates of an LSTM)."""
        if self.width % parts:
            raise TraceError(f"{_user_line()} (split): width {self.width} is not divisible by {parts}")
        w = self.width // parts
        where = _user_line()
        return [self._t.wrap(self._t.program.add("slice", (self.node,), where, start=i * w, stop=(i + 1) * w))
                for i in range(parts)]

    # reductions over a vertex's edges
    def sum(self) -> "Symbol":
        """Over the vertex's edges: the sum of this per-edge value (zeros where it has no children)."""
        return self._op("edge_sum", (self.node,))

    def mean(self) -> "Symbol":
        """Over the vertex's edges: the mean (zeros where it has no children)."""
        total = self._op("edge_sum", (self.node,))
        degree = self._t.num_children()
        return total / degree._op("max_const", (degree.node,), c=1.0)

    def max(self) -> "Symbol":
        """Over the vertex's edges: the largest value, per feature (zeros where it has no children)."""
        return self._op("edge_max", (self.node,))

    # a vertex function is static: no branching on, or comparing, traced values
    def __bool__(self):
        raise TraceError(f"{_user_line()}: a vertex function cannot branch on a traced value; F must be static "
                         "(every vertex runs the same ops; use masks or cavs.maximum for data-dependent values)")

    def _compare(self, other):
        raise TraceError(f"{_user_line()}: comparing a traced value (==, !=, <, <=, >, >=) gives no value a "
                         "vertex function can branch on; F must be static (cavs.maximum / cavs.minimum compute "
                         "with comparisons)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """NumPy's functions on a traced value: the ones that are ops map to them; others are named."""
        fn = _NUMPY_OPS.get(ufunc.__name__) if method == "__call__" and not kwargs else None
        if fn is None:
            raise TraceError(f"{_user_line()} (numpy.{ufunc.__name__}): not an op of vertex functions; the ops are "
                             f"{', '.join(sorted(_NUMPY_OPS))} and cavs.{{sigmoid, tanh, relu, feature_sum, "
                             "feature_mean, layer_norm, dropout}}")
        # a NumPy scalar operand (np.float32(0.5) * h, np.sqrt(2) * h) becomes the Python number it holds:
        # handed back as it is, its own operator would call this method again, without end
        plain = []
        for x in inputs:
            if isinstance(x, np.ndarray) and x.ndim == 0 or isinstance(x, np.generic):
                x = x.item()
            elif isinstance(x, np.ndarray):
                raise TraceError(f"{_user_line()} (numpy.{ufunc.__name__}): a NumPy array of shape {x.shape} "
                                 "in F; a constant operand is a Python number, a vector one a parameter (p.NAME)")
            plain.append(x)
        return fn(*plain)

    def __array_function__(self, func, types, args, kwargs):
        raise TraceError(f"{_user_line()} (numpy.{func.__name__}): not an op of vertex functions; over a vertex's "
                         "edges use e.sum() / e.mean() / e.max(), over the feature axis cavs.feature_sum(h)")

    def __iter__(self):
        raise TraceError(f"{_user_line()}: a traced value is one row vector per vertex; use .split(n) or slices")

    def __len__(self):
        raise TraceError(f"{_user_line()} (len): a traced value is one row vector per vertex; its width is "
                         f".width ({self.width})")

    def _no_number(self):
        raise TraceError(f"{_user_line()}: a traced value has no number while F is traced (it stands for every "
                         "vertex's row); compute with it, or read results from engine.predict / engine.forward")

    __float__ = __int__ = __index__ = __complex__ = _no_number

    __getattr__ = _no_attribute(".", "a traced value has", "it has .split(n), slices s[a:b], .width, and on per-edge "
                                "values .sum(), .mean(), .max(); functions are cavs.sigmoid, cavs.tanh, cavs.exp, "
                                "... (docs/library.md lists every op)", own=("_t", "node"))


class Param:
    def __init__(self, node: Node):
        self.node = node

    @property
    def shape(self):
        return self.node.shape

    def __getitem__(self, item):
        raise TraceError(f"{_user_line()} (param): p.{self.node.attrs['name']} cannot be indexed; "
                         "declare the pieces as parameters of their own, or slice a vertex value")

    def _alone(self, other=None):
        """Arithmetic between a parameter and a vertex value is the value's op (Python then calls
        its reflected operator); on parameters and numbers alone it is not an op."""
        if isinstance(other, Symbol):
            return NotImplemented
        raise TraceError(f"{_user_line()} (param): arithmetic on p.{self.node.attrs['name']} alone is not an op; F "
                         "computes per-vertex values: combine the parameter with one (x * p.b, x @ p.W) and "
                         "compute on the result")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _alone
    __pow__ = __rpow__ = __matmul__ = __neg__ = __pos__ = __abs__ = _alone


class Params:
    """`p.NAME` inside a vertex function: the named parameters of the model."""

    def __init__(self, tracer, shapes: dict[str, tuple]):
        self._tracer, self._shapes, self._nodes = tracer, shapes, {}

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._shapes:
            raise TraceError(f"{_user_line()}: unknown parameter p.{name}; the model declares "
                             f"{', '.join(self._shapes) or 'none'}")
        if name not in self._nodes:
            self._nodes[name] = Param(self._tracer.program.add("param", (), name=name, shape=self._shapes[name]))
        return self._nodes[name]


class EdgeSet:
    """`v.children()`: the vertex's edges, one row per (child -> vertex) edge, in child order."""

    def __init__(self, tracer: "Tracer"):
        self._t = tracer

    @property
    def state(self) -> Symbol:
        """What each child scattered, per edge."""
        return self._t.child_state()

    def broadcast(self, x: Symbol) -> Symbol:
        """The vertex value `x` on each of the vertex's edges."""
        return self._t.wrap(self._t.program.add("broadcast", (self._t.lift(x, "broadcast"),)))

    def softmax(self, s: Symbol) -> Symbol:
        """`s` (per edge) normalised over each vertex's edges, per feature: exp(s) / sum of exp(s)
        over the vertex's children (1 where it has one child)."""
        node = self._t.lift(s, "softmax")
        if node.domain != "edge":
            raise TraceError(f"{_user_line()} (softmax): kids.softmax(s) normalises a per-edge value over "
                             "each vertex's edges; got a per-vertex value")
        return self._t.wrap(self._t.program.add("edge_softmax", (node,)))

    __getattr__ = _no_attribute("children().", "the edges have", "they have .state (per edge), .broadcast(x) and "
                                ".softmax(e); reduce a per-edge value with e.sum(), e.mean(), e.max()")


def _not_a_param(node: Node, op: str) -> None:
    if node.is_param:
        raise TraceError(f"{_user_line()} ({op}): got the parameter p.{node.attrs['name']}; {op} takes a per-vertex "
                         "value, computed from what the vertex pulls or gathers")


class Vertex:
    """The `v` argument of a vertex function: the four message ops, and the vertex's edges."""

    def __init__(self, tracer: "Tracer"):
        self._t = tracer

    def gather(self, k: int) -> Symbol:
        """The state that child k scattered (zeros where the vertex has no child k)."""
        t = self._t
        if t.arity is None:
            raise TraceError(f"{_user_line()} (gather): gather(k) reads child slot k; declare the model's "
                             "arity=K, or use v.children() for any number of children")
        if not whole(k):
            raise TraceError(f"{_user_line()} (gather): the child index must be a whole number in 0..{t.arity - 1}, "
                             f"got {k!r}")
        if not 0 <= k < t.arity:
            raise TraceError(f"{_user_line()} (gather): child index {k} is beyond the declared arity {t.arity}")
        k = int(k)
        return t.wrap(t.program.add("gather", (), k=k, width=t.state_width))

    def gather_all(self) -> list[Symbol]:
        if self._t.arity is None:
            raise TraceError(f"{_user_line()} (gather): gather_all() reads every child slot; declare the "
                             "model's arity=K, or use v.children() for any number of children")
        return [self.gather(k) for k in range(self._t.arity)]

    def children(self) -> EdgeSet:
        """The vertex's edges: `.state` per edge, `.broadcast(x)`, `.softmax(e)`."""
        return EdgeSet(self._t)

    def num_children(self) -> Symbol:
        """The vertex's number of children, a width-1 value."""
        return self._t.num_children()

    def pull(self) -> Symbol:
        """This vertex's external input (zeros where it has none)."""
        t = self._t
        if t.input_width is None:
            raise TraceError(f"{_user_line()} (pull): this model declares no external input")
        if t.pulled is None:
            t.pulled = t.wrap(t.program.add("pull", (), width=t.input_width))
        return t.pulled

    def scatter(self, s: Symbol) -> None:
        """Makes `s` this vertex's state, visible to its parents through gather and children()."""
        t = self._t
        node = t.lift(s, "scatter")
        if t.scattered is not None:
            raise TraceError(f"{_user_line()} (scatter): scatter called twice (first at {t.scattered.where})")
        _not_a_param(node, "scatter")
        if node.shape != (t.state_width,):
            raise TraceError(f"{_user_line()} (scatter): the state has width {node.shape[0]}, "
                             f"but the model declares state width {t.state_width}")
        if node.domain != "vertex":
            raise TraceError(f"{_user_line()} (scatter): the state is a per-vertex value; reduce the edges "
                             "first (e.sum(), e.mean(), e.max())")
        t.scattered = t.program.add("scatter", (node,))

    def push(self, s: Symbol) -> None:
        """Sends `s` outside the structure (to the loss, or to the caller of engine.forward)."""
        t = self._t
        node = t.lift(s, "push")
        if t.pushed is not None:
            raise TraceError(f"{_user_line()} (push): push called twice (first at {t.pushed.where})")
        _not_a_param(node, "push")
        if node.domain != "vertex":
            raise TraceError(f"{_user_line()} (push): push sends a per-vertex value; reduce the edges first")
        t.pushed = t.program.add("push", (node,))

    __getattr__ = _no_attribute("v.", "a vertex has", "it has v.gather(k), v.children(), v.num_children(), v.pull(), "
                                "v.scatter(s) and v.push(s) (docs/library.md)")


class Tracer:
    def __init__(self, arity, state_width, input_width, param_shapes):
        self.program = Program()
        self.arity, self.state_width, self.input_width = arity, state_width, input_width
        self.params = Params(self, param_shapes)
        self.scattered: Node | None = None
        self.pushed: Node | None = None
        self.pulled: Symbol | None = None
        self._child_state: Symbol | None = None
        self._num_children: Symbol | None = None

    def wrap(self, node: Node) -> Symbol:
        return Symbol(self, node)

    def lift(self, value, op: str) -> Node:
        if isinstance(value, (Symbol, Param)):
            return value.node
        raise TraceError(f"{_user_line()} ({op}): expected a traced value or parameter, "
                         f"got {type(value).__name__}")

    def child_state(self) -> Symbol:
        if self._child_state is None:       # one per F: every use reads the same gathered rows
            self._child_state = self.wrap(self.program.add("child_state", (), width=self.state_width,
                                                           domain="edge"))
        return self._child_state

    def num_children(self) -> Symbol:
        if self._num_children is None:
            self._num_children = self.wrap(self.program.add("num_children", ()))
        return self._num_children


@dataclass
class VertexFunction:
    """F: the traced DAG plus its interface (arity, state width, input width, parameters used)."""
    nodes: list[Node]
    scatter: Node
    push: Node | None
    arity: int | None
    state_width: int
    input_width: int | None
    name: str

    @property
    def uses_slots(self) -> bool:
        """Reads children by position (gather(k)): the batch's degrees must fit the arity."""
        return any(n.op == "gather" for n in self.nodes)

    def dump(self) -> str:
        return "\n".join(map(repr, self.nodes))


def trace(fn, arity: int | None, state_width: int, input_width: int | None,
          param_shapes: dict[str, tuple]) -> VertexFunction:
    """Runs `fn(v, p)` once on symbols and returns F; errors name the user's line."""
    t = Tracer(arity, state_width, input_width, param_shapes)
    fn(Vertex(t), t.params)
    if t.scattered is None:
        code = getattr(fn, "__code__", None)
        where = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}" if code else "vertex function"
        raise TraceError(f"{where} ({getattr(fn, '__name__', 'F')}): scatter was never called; "
                         "a vertex function must scatter its state exactly once")
    return VertexFunction(t.program.nodes, t.scattered, t.pushed, arity, state_width, input_width,
                          getattr(fn, "__name__", "F"))


# ---------------------------------------------------------------- free functions of vertex functions

def _first_symbol(args, op: str) -> Symbol:
    for a in args:
        if isinstance(a, Symbol):
            return a
    raise TraceError(f"{_user_line()} ({op}): expected a traced value, got "
                     f"{', '.join(type(a).__name__ for a in args)}")


def _unary(op):
    def f(x: Symbol) -> Symbol:
        s = _first_symbol([x], op)
        return s._op(op, (s.node,))
    f.__name__ = op
    f.__doc__ = f"{op}(x), elementwise."
    return f


sigmoid, tanh, relu, exp, log = _unary("sigmoid"), _unary("tanh"), _unary("relu"), _unary("exp"), _unary("log")
abs_ = _unary("abs")


def _extremum(op):
    def f(a, b) -> Symbol:
        s = _first_symbol([a, b], op)
        if _number(a) or _number(b):
            x, c = (b, a) if _number(a) else (a, b)
            return s._op(f"{op[:3]}_const", (x.node,), c=_constant(c, op))
        return s._bin(op, b if s is a else a)
    f.__name__ = op
    f.__doc__ = f"{op}(a, b), elementwise; either may be a Python number."
    return f


maximum, minimum = _extremum("maximum"), _extremum("minimum")


def feature_sum(h: Symbol) -> Symbol:
    """The sum over the feature axis: a width-1 value."""
    s = _first_symbol([h], "feature_sum")
    return s._op("feature_sum", (s.node,))


def feature_mean(h: Symbol) -> Symbol:
    """The mean over the feature axis: a width-1 value."""
    return feature_sum(h) * (1.0 / _first_symbol([h], "feature_mean").width)


def layer_norm(h: Symbol, gain: Param | None = None, bias: Param | None = None, eps: float = 1e-5) -> Symbol:
    """(h - mean) / sqrt(var + eps) over the feature axis, then * gain + bias (parameters of the
    width of h, each optional)."""
    s = _first_symbol([h], "layer_norm")
    if _constant(eps, "layer_norm") is None or eps < 0:
        raise TraceError(f"{_user_line()} (layer_norm): eps must be a number of at least 0, got {eps!r}")
    for what, param in (("gain", gain), ("bias", bias)):
        if isinstance(param, Param) and tuple(param.shape) != (s.width,):
            raise TraceError(f"{_user_line()} (layer_norm): {what} must be a parameter of the value's width "
                             f"{s.width}; p.{param.node.attrs['name']} has shape {tuple(param.shape)}")
    centred = h - feature_mean(h)
    y = centred * (feature_mean(centred * centred) + eps) ** -0.5
    if gain is not None:
        y = y * gain
    if bias is not None:
        y = y + bias
    return y


def dropout(h: Symbol, rate: float) -> Symbol:
    """Zeroes each feature with probability `rate` and scales the rest by 1 / (1 - rate) while
    training (engine.step, loss_and_grads, forward); the identity in predict and infer. Masks are
    drawn per pass from the engine's seeded generator and kept for the backward pass."""
    s = _first_symbol([h], "dropout")
    if not _number(rate) or not 0 <= rate < 1:
        raise TraceError(f"{_user_line()} (dropout): the rate must be a number in [0, 1), got {rate!r}")
    if rate == 0:
        return s
    mask = s._t.program.add("dropout_mask", (), width=s.width, rate=float(rate), domain=s.node.domain)
    return s._bin("mul", s._t.wrap(mask))


def concat(*parts: Symbol) -> Symbol:
    if not parts:
        raise TraceError(f"{_user_line()} (concat): concat() needs at least one value")
    s = _first_symbol(parts, "concat")
    return s._op("concat", tuple(s._t.lift(p, "concat") for p in parts))


_NUMPY_OPS = {
    "exp": exp, "log": log, "tanh": tanh, "absolute": abs_, "maximum": maximum, "minimum": minimum,
    "add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
    "true_divide": lambda a, b: a / b, "divide": lambda a, b: a / b, "negative": lambda a: -a,
    "power": lambda a, b: a ** b, "sqrt": lambda a: a ** 0.5,
}
