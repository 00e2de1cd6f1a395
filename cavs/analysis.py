"""What the engine derives from F and dF once, before any batch: where each op runs (phases),
where a concat's parts are stored (concat elision), and which sums of matmuls are computed in one
buffer (GEMM epilogue fusion). Pure functions of the two DAGs; the engine (engine.py) turns them,
with each batch's schedule and support (support.py), into closures per task and runs them.

Every op of F (and of dF) is placed in one of three phases, from the dataflow alone:

  eager  does not depend on any gather (F) / on the state gradient (dF): e.g. the embedding
         input's `x Wx`. With eager=True it runs once over all rows before the task loop.
  loop   on the path gather -> scatter (F) / state gradient -> child gradient (dF): the
         critical path, run task by task (forward in task order, backward in reverse).
  lazy   off the critical path: e.g. push, the parameter-gradient matmuls and bias sums, the
         gradient of eager ops. With lazy=True it runs once over all rows after the loop:
         one large matmul per parameter gradient instead of one per task.

With a switch off, its ops run per task inside the loop, as a plain frontier loop would.
Because every dynamic tensor holds all rows in task order, an op over "all rows" and the same
op over each task's rows compute the same numbers (only summation order of reductions differs).
"""
from __future__ import annotations

from dataclasses import dataclass

from .ops import OPS, Node

PHASES = ("eager", "loop", "lazy")
# ops that need no work at run time: their dynamic tensor is a view of another buffer
# (num_children and the dropout masks are filled before F runs, like the pull buffer)
_VIEWS = {"param", "slice", "pull", "scatter", "push", "gather_grad_state", "pull_grad_output",
          "push_grad_input", "num_children", "dropout_mask"}
LOOP_MESSAGES = ("gather", "child_state", "scatter_grad_child", "child_state_grad")


def _closure(nodes, roots, forward: bool):
    """Nodes reachable from `roots` along inputs (forward=False) or consumers (forward=True)."""
    marked = set(roots)
    seq = nodes if forward else reversed(nodes)
    for n in seq:
        if forward and any(i in marked for i in n.inputs):
            marked.add(n)
        if not forward and n in marked:
            marked.update(n.inputs)
    return marked


def phases(nodes: list[Node], sources: set, sinks: set) -> dict[Node, str]:
    """eager/loop/lazy for every op that does work: see the module docstring."""
    downstream = _closure(nodes, sources, forward=True)   # depends on the loop-carried input
    upstream = _closure(nodes, sinks, forward=False)      # feeds the loop-carried output
    out = {}
    for n in nodes:
        if n.op in _VIEWS:
            continue
        if n.op in LOOP_MESSAGES:
            out[n] = "loop"
        elif n in upstream:
            out[n] = "loop" if n in downstream else "eager"
        else:
            out[n] = "lazy"
    return out


def concat_homes(nodes: list[Node], consumers: dict | None = None) -> dict[Node, tuple[Node, int]]:
    """Concat elision: {part: (concat, first column)} for each concat input that an op of F or
    dF writes (not a view of another buffer, not a message): it is stored in its concat's
    columns, so producing it fills the concat and the concat copies only its other parts
    (nothing, for [h; c] and the gate gradients of the LSTM cells). A part goes to its first
    concat only.

    Given each node's `consumers` (only with the CPU's row kernels, which write a row's pieces
    anywhere), a positional gather is a part too, and so is a slice of one whose every consumer
    is a slice: the gather
    then writes those columns of the child's state straight into the concat (gather_pieces), as
    [hl; hr] of the binary Tree-LSTM, which otherwise copied hl and hr out of [hl; cl] and
    [hr; cr] once more per task."""
    gathers = consumers is not None

    def sliced_gather(p):
        return p.op == "slice" and p.inputs[0].op == "gather" \
            and all(c.op == "slice" for c in consumers[p.inputs[0]])

    home = {}
    for n in nodes:
        if n.op != "concat":
            continue
        col = 0
        for p in n.inputs:
            writes = OPS[p.op].kind == "compute" or (gathers and (p.op == "gather" or sliced_gather(p)))
            if writes and p not in home:
                home[p] = (n, col)
            col += p.shape[0]
    return home


def gather_pieces(gather: Node, home: dict, consumers: dict) -> list[tuple[int, int, Node]] | None:
    """Where a gather whose slices live in concats (concat_homes) writes the child's state:
    [(first column, last column + 1, the value whose storage takes them)], the homed slices to
    their concats and the other slices' columns to the gather's own buffer; None when no slice of
    it is homed (the gather writes its whole row to its own storage)."""
    slices = consumers.get(gather, [])
    if not any(s in home for s in slices) or any(s.op != "slice" for s in slices):
        return None
    pieces = [(s.attrs["start"], s.attrs["stop"], s) for s in slices if s in home]
    own = sorted((s.attrs["start"], s.attrs["stop"]) for s in slices if s not in home)
    merged: list = []
    for a, b in own:                       # the unhomed slices' columns, overlapping ones merged
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return pieces + [(a, b, gather) for a, b in merged]


@dataclass(eq=False)
class AffineSum:
    """root = sum of `terms` (matmuls) [+ bias]: e.g. the LSTM gates x Wx + h Wh + b."""
    root: Node
    terms: list[Node]          # matmul nodes, in the order they run (Engine sorts them by phase)
    bias: Node | None          # a 1-D parameter
    inner: list[Node]          # the adds between the terms and the root


def affine_sums(nodes: list[Node], consumers: dict) -> list[AffineSum]:
    """GEMM epilogue fusion: each tree of adds whose leaves are matmuls (read by nothing else)
    and at most one bias. The matmuls then write into the root's buffer: the first one to run
    on a task adds the bias as it writes (beta = 0), later ones accumulate (beta = 1), so the
    terms are never stored apart, zero-filled where they are known zero, or added elementwise."""
    found, claimed = [], set()
    order = {n: k for k, n in enumerate(nodes)}
    for root in reversed(nodes):
        if root.op != "add" or root in claimed:
            continue
        terms, bias, inner, ok = [], [], [], True
        stack = [root]
        while stack and ok:
            n = stack.pop()
            for i in n.inputs:
                only_here = consumers.get(i) == [n]
                if i.op == "matmul" and only_here:
                    terms.append(i)
                elif i.op == "add" and only_here:
                    inner.append(i)
                    stack.append(i)
                elif i.is_param and len(i.shape) == 1 and not bias:
                    bias.append(i)
                else:
                    ok = False
        if ok and terms and len(terms) + len(bias) >= 2:
            found.append(AffineSum(root, sorted(terms, key=order.get), bias[0] if bias else None, inner))
            claimed.update(inner)
    return found
