"""Which tasks each op must compute, zero-fill or skip, from where values are known to be zero.

A leaf has no children, so everything computed from its gathers is zero there (e.g. [hl; hr] Uh
on the leaf frontier); an internal SST vertex has no word, so x Wx is zero there; a leaf's
gradient towards children it does not have is never read. Running such arithmetic is work the
workload does not need. Per batch, over tasks:

  support(n)  tasks where n may be non-zero (from the message ops' index plans and each op's
              `zero` rule in ops.py)
  demand(n)   tasks where some consumer reads n (walking F and dF backwards from the sinks)

and each op is computed on demand & support, filled with zeros on demand & ~support, and
skipped elsewhere. An add of two vertex values of which only one may be non-zero on a task
*passes* that one through (PASS + its input index): the other is then not read, so it is
neither computed nor zero-filled there. That is what makes variable arity cheap: with
`sum(gather_all())` over 32 child slots, a task whose vertices have at most 3 children pays for
3 slots, not 32. The arithmetic is unchanged wherever a value is read: exact, not approximate.
"""
from __future__ import annotations

import numpy as np

from .ops import OPS

SKIP, ZERO, COMPUTE, PASS = 0, 1, 2, 3     # PASS + k: the output is input k (the other is zero)


def _any_per_task(rows_mask: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    return np.add.reduceat(rows_mask.astype(np.int64), bounds[:-1]) > 0


def actions(F, dF, sched, mode: str = "train", pull_all: bool = False, cache: dict | None = None) -> dict:
    """{node: int8 array over tasks of SKIP / ZERO / COMPUTE / PASS + k} for every node that
    does work. `mode` "train": push is read where a label is (the built-in head's loss);
    "predict": at every vertex; "boundary" (engine.forward / backward): at every vertex, and
    every vertex's output may get a gradient. `pull_all`: every vertex pulls (caller's inputs).

    A task's actions depend only on its signature: whether it has a word, a label, edges, and a
    child in each slot F gathers. A batch has a few distinct signatures (leaves, inner vertices,
    ...), so the walk over F and dF runs once per distinct signature, and with `cache` (a dict
    the caller keeps for one F and dF: one int8 column per signature seen) once per signature ever."""
    slots = gathered_slots(F, dF)
    kinds, inverse = _distinct_columns(task_signals(sched, slots, pull_all))
    cache = {} if cache is None else cache
    keys = [(mode, pull_all, kinds[:, j].tobytes()) for j in range(kinds.shape[1])]
    missing = [j for j, key in enumerate(keys) if key not in cache]
    if missing:
        walked = _actions_of(F, dF, kinds[:, missing], dict(zip(slots, kinds[3:, missing])), mode)
        nodes = cache.setdefault("nodes", list(walked))        # the nodes that do work: F's, not the signals'
        table = np.stack([walked[n] for n in nodes])
        for i, j in enumerate(missing):
            cache[keys[j]] = table[:, i]
    table = np.stack([cache[key] for key in keys], axis=1)[:, inverse.reshape(-1)]
    return dict(zip(cache["nodes"], table))


def _distinct_columns(signals: np.ndarray):
    """np.unique(signals, axis=1, return_inverse=True) for a boolean (S, T) array: with S < 63
    each column is packed into one integer first, 6x faster than the column-wise unique."""
    if signals.shape[0] >= 63:
        kinds, inverse = np.unique(signals, axis=1, return_inverse=True)
        return kinds, inverse.reshape(-1)
    weights = np.left_shift(1, np.arange(signals.shape[0], dtype=np.int64))
    codes, inverse = np.unique(weights @ signals, return_inverse=True)
    kinds = (codes[None, :] & weights[:, None]) != 0
    return kinds, inverse


def gathered_slots(F, dF) -> list[int]:
    """The child slots F gathers (and dF scatters into): none for a model on edges."""
    return sorted({n.attrs["k"] for n in F.nodes + dF.nodes if n.op in ("gather", "scatter_grad_child")})


def task_signals(sched, slots: list[int], pull_all: bool = False) -> np.ndarray:
    """(3 + len(slots), T) per task: has a word (or pulls the caller's inputs), has a label, has
    edges, has a child in each of `slots`."""
    rows = [np.ones(sched.num_tasks, dtype=bool) if pull_all else _any_per_task(sched.tokens >= 0, sched.bounds),
            _any_per_task(sched.labels >= 0, sched.bounds), np.diff(sched.edge_bounds) > 0]
    return np.stack(rows + [_any_per_task(sched.child_rows[:, k] >= 0, sched.bounds) for k in slots])


def _actions_of(F, dF, signals: np.ndarray, has_child: dict, mode: str) -> dict:
    """actions() over columns of task signals: has_pull, has_label, has_edges, then has_child[k]."""
    has_pull, has_label, has_edges = signals[0], signals[1], signals[2]
    every = np.ones(signals.shape[1], dtype=bool)
    nodes = F.nodes + dF.nodes

    support = {}
    for n in nodes:
        if n.is_param:
            continue
        vertex_inputs = [support[i] for i in n.inputs if not i.is_param]
        rule = OPS[n.op].zero_rule(n.attrs)
        if n.op == "pull":
            s = has_pull
        elif n.op == "gather":
            s = has_child[n.attrs["k"]]
        elif n.op in ("child_state", "num_children", "edge_softmax"):
            s = has_edges                        # a task without children has no edges
        elif n.op == "pull_grad_output":
            s = every if mode == "boundary" else has_label
        elif n.op in ("gather_grad_state", "dropout_mask"):
            s = every
        elif rule == "full" or (rule == "union" and any(i.is_param for i in n.inputs)):
            s = every                            # e.g. sigmoid(0) = 0.5; a bias added to zero rows
        elif rule == "none" or not vertex_inputs:
            s = ~every
        elif rule in ("first", "second"):
            s = support[n.inputs[0 if rule == "first" else 1]] if not n.inputs[0 if rule == "first" else 1].is_param \
                else every
        elif rule == "intersect":
            s = np.logical_and.reduce(vertex_inputs)
        else:
            s = np.logical_or.reduce(vertex_inputs)
        if n.on_edges:
            s = s & has_edges
        support[n] = s

    demand = {n: ~every for n in support}
    act = {}
    for n in reversed(nodes):
        if n.is_param:
            continue
        if n.op == "scatter":
            reads = every
        elif n.op == "push":
            reads = has_label if mode == "train" else every
        elif n.op == "push_grad_input":
            reads = has_pull
        elif n.op in ("scatter_grad_child", "child_state_grad"):
            present = has_child[n.attrs["k"]] if n.op == "scatter_grad_child" else has_edges
            reads = present & support[n.inputs[0]]
            act[n] = np.where(reads, COMPUTE, SKIP).astype(np.int8)
        elif OPS[n.op].kind == "reduce":
            reads = support[n]
            act[n] = np.where(reads, COMPUTE, SKIP).astype(np.int8)
        elif n.op == "slice":
            reads = demand[n]                    # a view: its readers read its input
        elif n.op == "add" and not any(i.is_param for i in n.inputs) and n.inputs[0] is not n.inputs[1] \
                and n.inputs[0].shape == n.inputs[1].shape:
            s0, s1 = (support[i] for i in n.inputs)
            compute = demand[n] & s0 & s1
            passes = [demand[n] & s0 & ~s1, demand[n] & s1 & ~s0]
            a = np.where(compute, COMPUTE, np.where(demand[n] & ~(s0 | s1), ZERO, SKIP))
            a = np.where(passes[0], PASS, np.where(passes[1], PASS + 1, a))
            act[n] = a.astype(np.int8)
            for i, p in zip(n.inputs, passes):
                demand[i] = demand[i] | compute | p
            continue
        else:
            compute = demand[n] & support[n]
            act[n] = np.where(compute, COMPUTE, np.where(demand[n], ZERO, SKIP)).astype(np.int8)
            reads = compute
        for i in n.inputs:
            if not i.is_param:
                demand[i] = demand[i] | reads
    return act


def ranges(mask: np.ndarray, bounds: np.ndarray) -> list[tuple[int, int]]:
    """The row ranges of the tasks in `mask`, adjacent tasks merged into one range."""
    out = []
    for t in np.flatnonzero(mask):
        a, b = int(bounds[t]), int(bounds[t + 1])
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


# ops that read only the rows they are given: where their vertex input is zero outside some rows,
# they run on those rows alone (engine._subset_fn, engine._affine_fn)
ROW_SUBSET_OPS = ("matmul", "matmul_t", "param_grad", "bias_grad")


def row_bounds(nodes) -> dict:
    """{node: frozenset of child slots} for each vertex value that is zero on every row whose
    vertex has none of those children.

    actions() works per task: a task computes child slot k's work on all its rows if any of them
    has child k. With variable arity most of those rows lack child k (an n-ary vertex of 3
    children in a task whose widest vertex has 12), and a policy other than `batched` puts leaves
    and inner vertices in one task; products and parameter gradients bounded this way then run on
    the rows with those children alone (engine._subset_fn): the same numbers, without multiplying
    rows known to be zero. The rules follow each op's `zero` rule, per row instead of per task:
    `union` is bounded by the union of its inputs' slots when every vertex input is bounded,
    `intersect` by its most narrowly bounded input."""
    bound = {}
    for n in nodes:
        if n.is_param:
            continue
        vertex_inputs = [i for i in n.inputs if not i.is_param]
        rule = OPS[n.op].zero_rule(n.attrs)
        if n.op == "gather":
            ks = frozenset([n.attrs["k"]])
        elif n.op in ("pull", "pull_grad_output", "gather_grad_state") or rule in ("full", "none") \
                or not vertex_inputs or (rule == "union" and len(vertex_inputs) < len(n.inputs)) \
                or n.on_edges or OPS[n.op].domain != "same" or OPS[n.op].kind == "source":
            ks = None
        elif rule in ("first", "second"):
            ks = bound.get(n.inputs[0 if rule == "first" else 1])
        elif rule == "intersect":
            ks = min((bound[i] for i in vertex_inputs if i in bound), key=len, default=None)
        else:
            ks = frozenset().union(*(bound[i] for i in vertex_inputs)) \
                if all(i in bound for i in vertex_inputs) else None
        if ks is not None:
            bound[n] = ks
    return bound
