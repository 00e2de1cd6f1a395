"""Batching policies: which vertices of a batch run together as one task, in what order.

A schedule numbers every vertex of the batch with a row: rows are in task order, so task t
is the contiguous row range [bounds[t], bounds[t+1]) and every dynamic tensor of F is one
contiguous array over all rows. Backward replays the tasks in reverse.

  batched  every frontier of ready vertices across the whole batch is one task (a vertex is
           ready when all its children are done: its level = longest path from a leaf)
  serial   one vertex per task, sample by sample (the paper's serial baseline)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .graphs import Forest

POLICIES = ("batched", "serial")


@dataclass
class Schedule:
    order: np.ndarray        # (N,) global vertex id held by each row
    bounds: np.ndarray       # (T+1,) task t = rows [bounds[t], bounds[t+1])
    child_rows: np.ndarray   # (N, arity) row of child k of each row, -1 where absent
    tokens: np.ndarray       # (N,) token of each row, -1 where none
    labels: np.ndarray       # (N,) label of each row, -1 where none

    @property
    def num_rows(self) -> int:
        return len(self.order)

    @property
    def num_tasks(self) -> int:
        return len(self.bounds) - 1

    def tasks(self):
        b = self.bounds.tolist()
        return list(zip(b[:-1], b[1:]))


def schedule(forest: Forest, policy: str = "batched") -> Schedule:
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")
    level = forest.level                     # computed (and checked acyclic) by make_forest
    n = forest.num_vertices
    if policy == "batched":
        order = np.argsort(level, kind="stable")
        sorted_level = level[order]
        bounds = np.concatenate([[0], np.flatnonzero(np.diff(sorted_level)) + 1, [n]])
    else:
        order = np.lexsort((level, forest.sample))   # by sample, then children before parents
        bounds = np.arange(n + 1)
    row_of = np.empty(n, dtype=np.int64)
    row_of[order] = np.arange(n)
    kids = forest.children[order]
    child_rows = np.where(kids >= 0, row_of[np.maximum(kids, 0)], -1)
    return Schedule(order, bounds.astype(np.int64), child_rows,
                    forest.tokens[order], forest.labels[order])
