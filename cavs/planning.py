"""Planning and running one batch: which steps run on which rows, in what order.

Per batch, support.py says what each op computes, zero-fills, passes through or skips on each
task. A plan turns that into closures (lowering.py's steps): the eager phase as (step, a, b) over
whole-batch row ranges, the task loop as one list of steps per task (shared by the tasks alike in
what they skip: their "signature"), the lazy phase like the eager one. Ranges are in each step's
own domain: vertex rows, or edge rows for per-edge values. `run` executes a plan: the eager phase
once (or on a second stream/thread, streaming), the loop task by task (forward in task order,
backward in reverse), the lazy phase once. Because every dynamic tensor holds all rows in task
order, an op over "all rows" and the same op over each task's rows compute the same numbers (only
the summation order of reductions differs).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from . import fusion
from .support import COMPUTE, PASS, SKIP, ZERO, ranges

STREAM_CHUNKS = 4      # streaming: eager work is cut into this many pieces along the task order
# A fused group that computes only in part on some tasks (a leaf has no children, an n-ary vertex
# uses 3 of 32 child slots) gets a smaller kernel for that combination of members: one Numba
# compile (0.3-6 s) per combination. With many child slots the combinations multiply, so only a
# combination that covers at least this share of a batch's rows gets its own kernel; the rarer
# ones run member by member. (Binary Tree-LSTM: the leaves' combination is ~half the rows.)
VARIANT_MIN_SHARE = 0.1


@dataclass
class BatchPlans:
    """What lowering's steps read of the batch: its schedule, message and edge plans, actions."""
    sched: object
    messages: object
    edges: object
    actions: dict
    row_sets: dict = field(default_factory=dict)    # (slots, a, b) -> the rows with those children
    tokens: object = None     # tokens.BatchTokens where the batch's products share tokens


def _on_edges(item) -> bool:
    return (item.nodes[0] if isinstance(item, fusion.FusedGroup) else item).on_edges


def plan(low, phase_items, batch: BatchPlans) -> dict:
    """This batch's work: (step, a, b, on edges) for whole-batch phases, (step, on edges) per
    loop task."""
    act, sched = batch.actions, batch.sched
    bounds_of = {False: sched.bounds, True: sched.edge_bounds}
    out = {}
    for phase in ("eager", "lazy"):
        out[phase] = []
        for item in phase_items[phase]:
            edge = _on_edges(item)
            bounds = bounds_of[edge]
            if item in low.affine or item in low.sum_of:
                out[phase] += [(s, a, b, edge) for s, a, b in _per_task_ranges(low, item, act, bounds)]
                continue
            members = item.nodes if isinstance(item, fusion.FusedGroup) else [item]
            if isinstance(item, fusion.FusedGroup) and all((act[m] == act[members[0]]).all() for m in members) \
                    and not (act[members[0]] >= PASS).any():
                first = act[members[0]]         # one kernel where they compute
                out[phase] += [(low.step(item, COMPUTE), a, b, edge) for a, b in ranges(first == COMPUTE, bounds)]
                out[phase] += [(low.step(o, ZERO), a, b, edge) for o in item.outputs
                               for a, b in ranges(first == ZERO, bounds)]
                continue
            for m in members:                   # member by member, in topological order
                for action in np.unique(act[m]):
                    if action == SKIP or (action == COMPUTE and m in low.elided):
                        continue
                    mask = act[m] == action
                    out[phase] += [(low.step(m, int(action)), a, b, edge) for a, b in ranges(mask, bounds)]
    loop = phase_items["loop"]
    loop_nodes = [m for it in loop for m in (it.nodes if isinstance(it, fusion.FusedGroup) else [it])]
    loop_nodes += [t for a in low.affine.values() for t in a.terms if t not in loop_nodes]
    column = {m: k for k, m in enumerate(loop_nodes)}
    signatures = np.stack([act[n] for n in loop_nodes], axis=1) if loop_nodes \
        else np.zeros((sched.num_tasks, 0), dtype=np.int8)
    per_task = []
    sigs = list(map(tuple, signatures.tolist()))
    rows_of = {}
    for sig, n in zip(sigs, np.diff(sched.bounds).tolist()):
        rows_of[sig] = rows_of.get(sig, 0) + n
    for sig in sigs:
        # partial fused kernels only for signatures that carry a real share of the rows
        variants = rows_of[sig] >= VARIANT_MIN_SHARE * sched.num_rows
        key = (id(loop), sig, variants)    # forward and backward loops have separate signatures
        if key not in low.task_steps:      # steps read the batch at call time: shared by all batches
            low.task_steps[key] = [(s, _on_edges(it)) for it in loop
                                   for s in low.item_steps(it, lambda m: sig[column[m]], variants)]
        per_task.append(low.task_steps[key])
    out["loop"] = per_task
    return out


def _per_task_ranges(low, item, act, bounds) -> list:
    """(step, a, b) for a whole-batch phase, adjacent tasks with the same step merged."""
    out = []
    for t in range(len(bounds) - 1):
        for s in low.item_steps(item, lambda m: act[m][t]):
            a, b = int(bounds[t]), int(bounds[t + 1])
            if out and out[-1][0] is s and out[-1][2] == a:
                out[-1] = (s, out[-1][1], b)
            else:
                out.append((s, a, b))
    return out


def run(the_plan: dict, sched, backend, streaming: bool, reverse: bool = False) -> None:
    """The eager phase, the loop (in reverse for backward), the lazy phase. Streaming: the eager
    steps run on a second stream ahead of the loop (the loop waits for the chunk of tasks it
    reaches), and, where the backend can (`trail`: the CPU's worker thread), the lazy steps run
    there behind it, each chunk of tasks as soon as the loop has finished it."""
    tasks, edge_tasks = sched.tasks(), sched.edge_tasks()
    order = list(range(len(tasks) - 1, -1, -1) if reverse else range(len(tasks)))
    wait = backend.stream(_chunks(the_plan["eager"], tasks, edge_tasks, order)) \
        if streaming and the_plan["eager"] else None
    trail = backend.trail(_chunks(the_plan["lazy"], tasks, edge_tasks, order)) \
        if streaming and the_plan["lazy"] and hasattr(backend, "trail") else None
    if wait is None:
        for step, a, b, _ in the_plan["eager"]:
            step(a, b, -1)
    loop = the_plan["loop"]
    for k, t in enumerate(order):
        chunk = k * STREAM_CHUNKS // len(order)
        if wait is not None:
            wait(chunk)
        a, b = tasks[t]
        ea, eb = edge_tasks[t]
        for step, edge in loop[t]:
            if edge:
                step(ea, eb, t)
            else:
                step(a, b, t)
        if trail is not None and (k + 1 == len(order) or (k + 1) * STREAM_CHUNKS // len(order) != chunk):
            trail.ready(chunk)                 # this chunk's rows are final: its lazy steps may run
    if trail is not None:
        trail.finish()
        return
    for step, a, b, _ in the_plan["lazy"]:
        step(a, b, -1)


def _chunks(steps, tasks, edge_tasks, order) -> list[list]:
    """`steps` (step, a, b, on edges) cut into STREAM_CHUNKS chunks of tasks in loop order: per
    chunk, each step on the part of its rows that lies in the chunk's tasks."""
    chunks = []
    for c in range(STREAM_CHUNKS):
        mine = [t for k, t in enumerate(order) if k * STREAM_CHUNKS // len(order) == c]
        if not mine:
            chunks.append([])
            continue
        span = {False: (tasks[min(mine)][0], tasks[max(mine)][1]),
                True: (edge_tasks[min(mine)][0], edge_tasks[max(mine)][1])}
        chunk = []
        for step, a, b, edge in steps:
            lo, hi = span[edge]
            if max(a, lo) < min(b, hi):
                chunk.append(functools.partial(step, max(a, lo), min(b, hi), -1))
        chunks.append(chunk)
    return chunks
