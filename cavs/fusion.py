"""Kernel fusion: groups of directly linked elementwise ops of F or dF become one kernel each.

Union-find over the dataflow edges between elementwise ops (ops.py: those with an `expr`) of
the same phase and the same width finds the largest linked groups; a group whose members are
linked through an op outside it (a path that leaves and re-enters) is split, so a group can run
as one step. Each group is rendered from the ops' expression templates into one kernel that
reads its external inputs and writes only the values something outside the group reads (the
rest stay in registers): a Numba loop on the CPU, a `cupy.ElementwiseKernel` on the GPU.
Compiled kernels are cached by their source text.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .ops import OPS, Node


@dataclass(eq=False)
class FusedGroup:
    nodes: list[Node]        # in topological order
    inputs: list[Node]       # values read from outside the group (vertex tensors or parameters)
    outputs: list[Node]      # members read outside the group: materialized
    width: int


def _find(parent, x):
    while parent[x] is not x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def find_groups(nodes: list[Node], consumers: dict[Node, list[Node]]) -> list[FusedGroup]:
    """Largest groups (2+ ops) of linked elementwise ops among `nodes` (one phase of F or dF)."""
    fusable = [n for n in nodes if OPS[n.op].elementwise]
    member = set(fusable)
    parent = {n: n for n in fusable}
    for n in fusable:
        for i in n.inputs:
            if i in member and i.shape == n.shape:
                parent[_find(parent, i)] = _find(parent, n)
    groups: dict[Node, list[Node]] = {}
    for n in fusable:
        groups.setdefault(_find(parent, n), []).append(n)
    out = []
    for members in groups.values():
        for part in _convex_parts(members, consumers):
            if len(part) > 1:
                out.append(describe(part, consumers))
    return out


def _convex_parts(members: list[Node], consumers) -> list[list[Node]]:
    """The group itself, or its members one by one when a path leaves it and re-enters (then it
    could not run as one step; none of the paper's four cells has such a group)."""
    inside = set(members)
    reach_out: set[Node] = set()       # outside nodes reachable from the group
    stack = [c for m in members for c in consumers.get(m, []) if c not in inside]
    while stack:
        n = stack.pop()
        if n not in reach_out:
            reach_out.add(n)
            stack.extend(consumers.get(n, []))
    if any(i in reach_out for m in members for i in m.inputs):
        return [[m] for m in members]
    return [members]


def describe(members: list[Node], consumers) -> FusedGroup:
    """The group of `members` (topologically ordered): what it reads and what it must write."""
    inside = set(members)
    inputs: list[Node] = []
    for m in members:
        for i in m.inputs:
            if i not in inside and i not in inputs:
                inputs.append(i)
    outputs = [m for m in members if any(c not in inside for c in consumers.get(m, []))]
    return FusedGroup(members, inputs, outputs, members[0].shape[0])


def contracted_order(nodes: list[Node], groups: list[FusedGroup]) -> list:
    """`nodes` in a topological order where each group is one item (a FusedGroup)."""
    group_of = {m: g for g in groups for m in g.nodes}
    item = lambda n: group_of.get(n, n)                       # noqa: E731
    items = list(dict.fromkeys(item(n) for n in nodes))
    position = {it: k for k, it in enumerate(items)}
    deps = {it: set() for it in items}
    for n in nodes:
        for i in n.inputs:
            if i in position or i in group_of:
                if item(i) is not item(n) and item(i) in deps:
                    deps[item(n)].add(item(i))
    order, done = [], set()
    while len(order) < len(items):       # Kahn's algorithm, keeping the original order on ties
        nxt = next(it for it in items if it not in done and deps[it] <= done)
        order.append(nxt)
        done.add(nxt)
    return order


def expression_lines(group: FusedGroup, ref) -> list[str]:
    """One assignment per member: `v<id> = <template over its inputs>`; ref(node) names an input."""
    local = {m: f"v{m.id}" for m in group.nodes}
    lines = []
    for m in group.nodes:
        args = [local.get(i) or ref(group.inputs.index(i), i) for i in m.inputs]
        lines.append(f"v{m.id} = {OPS[m.op].expr.format(*args)}")
    return lines


# ---------------------------------------------------------------- CPU: Numba

# float32 kernels use Eigen's rational tanh (what TensorFlow and DyNet use on the CPU; about
# 2 ulp): libm's scalar tanhf does not vectorize and is slower than NumPy's SIMD loop.
# float64 kernels call libm's tanh, so the float64 correctness tests see unchanged arithmetic.
_RATIONAL_TANH = """
def tanh(x):
    x = min(max(x, F(-7.90531110763549805)), F(7.90531110763549805))
    x2 = x * x
    p = x2 * F(-2.76076847742355e-16) + F(2.00018790482477e-13)
    p = x2 * p + F(-8.60467152213735e-11)
    p = x2 * p + F(5.12229709037114e-08)
    p = x2 * p + F(1.48572235717979e-05)
    p = x2 * p + F(6.37261928875436e-04)
    p = x2 * p + F(4.89352455891786e-03)
    q = x2 * F(1.19825839466702e-06) + F(1.18534705686654e-04)
    q = x2 * q + F(2.26843463243900e-03)
    q = x2 * q + F(4.89352518554385e-03)
    return x * p / q
"""
_CONSTANT = re.compile(r"(?<![\w.])(\d+\.\d+)")


def numba_source(group: FusedGroup) -> str:
    """A loop over rows; each vertex operand is passed as its C-contiguous buffer and the column
    where it starts, and each row is sliced into 1-D contiguous pieces so that LLVM vectorizes
    the inner loop (a strided 2-D view, or flat offset arithmetic, keeps it scalar: 2-4x slower)."""
    w = group.width
    args, pieces = [], []
    for k, node in enumerate(group.inputs):
        if node.is_param:
            args.append(f"in{k}")
            pieces.append(f"x{k} = in{k}")
        else:
            args += [f"in{k}", f"in{k}_col"]
            pieces.append(f"x{k} = in{k}[r, in{k}_col:in{k}_col + {w}]")
    for k in range(len(group.outputs)):
        args += [f"out{k}", f"out{k}_col"]
        pieces.append(f"y{k} = out{k}[r, out{k}_col:out{k}_col + {w}]")
    body = [_CONSTANT.sub(r"F(\1)", line) for line in expression_lines(group, lambda k, node: f"x{k}[j]")]
    body += [f"y{k}[j] = v{o.id}" for k, o in enumerate(group.outputs)]
    row = "\n".join("        " + line for line in pieces)
    inner = "\n".join("            " + line for line in body)
    return (f"def kernel(r0, r1, {', '.join(args)}):\n"
            f"    for r in range(r0, r1):\n{row}\n"
            f"        for j in range({w}):\n{inner}\n")


@functools.lru_cache(maxsize=None)
def compile_numba(source: str, dtype: str):
    import math

    import numba
    import numpy as np
    fast = dtype == "float32"
    namespace = {"F": getattr(np, dtype), "tanh": math.tanh}
    if fast:
        exec(_RATIONAL_TANH, namespace)
        namespace["tanh"] = numba.njit(inline="always", fastmath=True, error_model="numpy")(namespace["tanh"])
    exec(compile(source, "<cavs-fused>", "exec"), namespace)
    # error_model="numpy": no division-by-zero branch (the rational tanh divides), which would
    # keep LLVM from vectorizing the loop
    return numba.njit(nogil=True, fastmath=fast, error_model="numpy")(namespace["kernel"])


# ---------------------------------------------------------------- GPU: CuPy

def cupy_source(group: FusedGroup) -> tuple[str, str, str]:
    in_params = ", ".join(f"T in{k}" for k in range(len(group.inputs)))
    out_params = ", ".join(f"T out{k}" for k in range(len(group.outputs)))
    body = [f"T {line};" for line in expression_lines(group, lambda k, node: f"in{k}")]
    body += [f"out{k} = v{o.id};" for k, o in enumerate(group.outputs)]
    return in_params, out_params, "\n".join(body)


@functools.lru_cache(maxsize=None)
def compile_cupy(in_params: str, out_params: str, body: str):
    import cupy
    return cupy.ElementwiseKernel(in_params, out_params, body, "cavs_fused")
