"""Batching policies: which vertices of a batch run together as one task, in what order.

A schedule numbers every vertex of the batch with a row: rows are in task order, so task t
is the contiguous row range [bounds[t], bounds[t+1]) and every dynamic tensor of F is one
contiguous array over all rows. Backward replays the tasks in reverse. A task never holds a
vertex and one of its children: every child's row is in an earlier task.

  batched  as soon as possible: every frontier of ready vertices across the whole batch is one
           task (a vertex is ready when all its children are done: its level = the longest
           path from a leaf)
  alap     as late as possible: by depth from the root, all roots in the last task (a vertex's
           level = the lowest of its parents' levels - 1, so every child still runs before
           each of its parents)
  merged   as soon as possible, then each task smaller than MERGE_MIN_ROWS, from the last to
           the first, takes vertices from the largest earlier tasks where the dependencies
           allow (every parent of a moved vertex runs after its new task); vertices without
           children stay in the first task
  serial   one vertex per task, sample by sample (the paper's serial baseline)

Whole tasks of a level schedule can never merge: every vertex of task t+1 has a child in task
t (batched), or every vertex of task t a parent in task t+1 (alap), so both policies already
have the fewest tasks possible, the longest path in the batch. What a policy can change is how
the rows spread over those tasks. A small task costs nearly as much as a large one (its
matmuls stream the whole weight matrix through the cache), so `merged` moves rows from large
tasks into small ones; on inputs where every vertex has one legal level (complete trees of one
height, as Tree-FC's) all three give the same tasks.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .graphs import Forest

POLICIES = ("batched", "alap", "merged", "serial")
# `merged`: tasks below this many rows are filled from larger ones. At h = 512 a task's state
# matmul streams the 10 MB weight: about as long as computing ~25-30 rows at the large-product rate
MERGE_MIN_ROWS = 32


@dataclass
class Schedule:
    """Rows in task order, and the edges (child -> parent) of every row in the same order: task t
    is rows [bounds[t], bounds[t+1]) and edges [edge_bounds[t], edge_bounds[t+1]); a row's edges
    are [edge_offset[r], edge_offset[r+1]), in slot order."""
    order: np.ndarray        # (N,) global vertex id held by each row
    bounds: np.ndarray       # (T+1,) task t = rows [bounds[t], bounds[t+1])
    tokens: np.ndarray       # (N,) token of each row, -1 where none
    labels: np.ndarray       # (N,) label of each row, -1 where none
    edge_child: np.ndarray   # (E,) row of each edge's child
    edge_parent: np.ndarray  # (E,) row of each edge's parent, non-decreasing
    edge_slot: np.ndarray    # (E,) the child's slot at its parent
    width: int               # slots per row (positional gathers read slots 0 .. width-1)

    def __post_init__(self):
        self.edge_offset = np.searchsorted(self.edge_parent, np.arange(self.num_rows + 1)).astype(np.int64)
        self.edge_bounds = self.edge_offset[self.bounds]

    @property
    def num_rows(self) -> int:
        return len(self.order)

    @property
    def num_tasks(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_edges(self) -> int:
        return len(self.edge_child)

    @property
    def degree(self) -> np.ndarray:
        """(N,) each row's number of children."""
        return np.diff(self.edge_offset)

    @functools.cached_property
    def child_rows(self) -> np.ndarray:
        """(N, width) row of child k of each row, -1 where absent (for positional gathers)."""
        out = np.full((self.num_rows, max(1, self.width)), -1, dtype=np.int64)
        out[self.edge_parent, self.edge_slot] = self.edge_child
        return out

    def tasks(self):
        b = self.bounds.tolist()
        return list(zip(b[:-1], b[1:]))

    def edge_tasks(self):
        b = self.edge_bounds.tolist()
        return list(zip(b[:-1], b[1:]))

    def task_of_rows(self) -> np.ndarray:
        """(N,) the task of each row."""
        return np.repeat(np.arange(self.num_tasks), np.diff(self.bounds))

    def respects_dependencies(self) -> bool:
        """Every child's row lies in a task before its parent's task."""
        task = self.task_of_rows()
        return bool((task[self.edge_child] < task[self.edge_parent]).all())


def alap_levels(forest: Forest) -> np.ndarray:
    """As late as possible: roots at the last level; every other vertex one level below the
    lowest of its parents (its longest path to a root, counted from the last level)."""
    level = forest.level
    n = forest.num_vertices
    last = int(level.max()) if n else 0
    late = np.full(n, last, dtype=np.int64)
    order = np.argsort(level, kind="stable")
    starts = np.searchsorted(level[order], np.arange(last + 2))
    edge_start = np.searchsorted(forest.edge_parent, np.arange(n + 1))
    for lv in range(last, 0, -1):            # a vertex's parents all sit on higher ASAP levels
        vs = order[starts[lv]:starts[lv + 1]]
        counts = edge_start[vs + 1] - edge_start[vs]
        edges = np.repeat(edge_start[vs] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        np.minimum.at(late, forest.edge_child[edges], np.repeat(late[vs] - 1, counts))
    return late


def merged_levels(forest: Forest, min_rows: int = MERGE_MIN_ROWS) -> np.ndarray:
    """ASAP levels, then from the last level down, each level with fewer than `min_rows`
    vertices takes vertices that may move there: from an earlier level, with children, and
    with every parent above it. It takes them from the largest levels first, never leaving a
    level with fewer vertices than it has itself. Moves only raise levels, so a vertex moved
    earlier in the walk keeps its parents above it."""
    level = forest.level.astype(np.int64).copy()
    n = forest.num_vertices
    if n == 0:
        return level
    last = int(level.max())
    child, parent = forest.edge_child, forest.edge_parent
    movable = np.bincount(parent, minlength=n) > 0
    count = np.bincount(level, minlength=last + 1)
    for t in range(last, 0, -1):
        if count[t] >= min_rows:
            continue
        lowest_parent = np.full(n, last + 1, dtype=np.int64)
        np.minimum.at(lowest_parent, child, level[parent])
        cand = np.flatnonzero(movable & (level < t) & (lowest_parent > t))
        if len(cand) == 0:
            continue
        # largest source levels first; within a level, the vertex order (stable)
        cand = cand[np.argsort(-count[level[cand]], kind="stable")]
        for v in cand.tolist():
            s = level[v]
            if count[t] >= min_rows:
                break
            if count[s] - 1 < count[t] + 1:      # would leave its level no larger than this one
                continue
            level[v] = t
            count[s] -= 1
            count[t] += 1
    return level


def schedule(forest: Forest, policy: str = "batched") -> Schedule:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")
    n = forest.num_vertices
    if policy == "serial":
        order = np.lexsort((forest.level, forest.sample))   # by sample, then children before parents
        bounds = np.arange(n + 1)
    else:
        level = {"batched": forest.level, "alap": alap_levels, "merged": merged_levels}[policy]
        level = level if isinstance(level, np.ndarray) else level(forest)   # computed (and checked acyclic) by make_forest
        order = np.argsort(level, kind="stable")
        sorted_level = level[order]
        bounds = np.concatenate([[0], np.flatnonzero(np.diff(sorted_level)) + 1, [n]])
    row_of = np.empty(n, dtype=np.int64)
    row_of[order] = np.arange(n)
    parent, child = row_of[forest.edge_parent], row_of[forest.edge_child]
    by_parent = np.lexsort((forest.edge_slot, parent))     # rows' edges together, in slot order
    return Schedule(order, bounds.astype(np.int64), forest.tokens[order], forest.labels[order],
                    child[by_parent], parent[by_parent], forest.edge_slot[by_parent], forest.width)
