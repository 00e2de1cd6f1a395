"""Dynamic tensors, the message buffers and the per-task plans of the four message ops.

A dynamic tensor holds one symbol of F for every vertex of the batch: shape (rows, width),
where `width` is the symbol's shape without the batch dimension and the batch size is a
placeholder filled per task. Its memory is one contiguous, growable buffer; task t writes
rows [offset_t, offset_t + size_t): the offset advances task by task in forward and walks back
in backward. Because rows are in task order (scheduler.py), the state that a vertex scatters
is simply its rows of the scattered symbol's tensor, and `pull`/`push` are views of the
external buffers: memory is moved only by gather (children's states into a task's rows),
the gradient scatter (its dual), the embedding lookup that fills the pull buffer at F's entry,
and the loss reading pushed rows at F's exit. `Counters` records those bytes and every kernel,
`Timings` the seconds.
"""
from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from .scheduler import Schedule


class DynamicTensor:
    """(rows, width) storage for one symbol; grows geometrically and is reused across batches."""

    def __init__(self, backend, width: int, dtype):
        self.backend, self.width, self.dtype = backend, width, dtype
        self.buffer = backend.xp.empty((0, width), dtype=dtype)

    def reserve(self, rows: int) -> bool:
        """Makes room for `rows`; returns True when the buffer moved (views must be rebuilt).

        Grows with 25% headroom over the request: batches of one data set differ by a few
        percent in vertex count, and each reallocation costs the first touch of every new page
        (on the reference VM, 0.6 s for Tree-LSTM h = 512 at bs = 64), so it should happen
        once, not at the first batch a few rows larger."""
        if rows <= self.buffer.shape[0]:
            return False
        capacity = max(int(rows * 1.25), int(self.buffer.shape[0] * 1.5))
        self.buffer = self.backend.xp.empty((capacity, self.width), dtype=self.dtype)
        return True


class Buffers:
    """Every value's storage for a batch: `arrays[slot]` is its (rows, width) array (a parameter,
    its own dynamic tensor, its concat's columns, its affine sum's buffer, or a slice of its
    input), vertex values over the batch's rows and edge values over its edges; `based[slot]` is
    (C-contiguous buffer, first column), for the CPU's fused kernels. `bind` reserves every tensor
    for a batch and rebuilds the views when one moved."""

    def __init__(self, backend, dtype, nodes, slot, stored, home, sum_of, fused_cpu: bool):
        self.nodes, self.slot, self.home, self.sum_of, self.fused_cpu = nodes, slot, home, sum_of, fused_cpu
        self.tensors = {n: DynamicTensor(backend, n.shape[0], dtype) for n in stored}
        self.arrays: list = [None] * len(nodes)
        self.based: list = [None] * len(nodes)
        self.itemsize = np.dtype(dtype).itemsize
        self._bound = None

    def bind(self, rows: int, edges: int, params: dict) -> None:
        moved = [t.reserve(edges if n.on_edges else rows) for n, t in self.tensors.items()]
        A, slot = self.arrays, self.slot
        if any(moved) or self._bound is None:
            for n, i in slot.items():
                if n.is_param:
                    A[i] = params[n.attrs["name"]]
                elif n in self.tensors:
                    A[i] = self.tensors[n].buffer
            for n in slot:                     # concat parts: views of their concat's columns
                if n in self.home:
                    A[slot[n]] = self._home_view(n)
            for n, a in self.sum_of.items():    # affine sums: one buffer, the root's
                A[slot[n]] = A[slot[a.root]]
            for n, i in slot.items():          # views: slices of their input's columns
                if n.op == "slice" and n not in self.home:
                    A[i] = A[slot[n.inputs[0]]][:, n.attrs["start"]:n.attrs["stop"]]
            if self.fused_cpu:
                self._bind_bases()
            self._bound = (rows, edges)
        for n, i in slot.items():              # parameters may have been reassigned
            if n.is_param:
                A[i] = params[n.attrs["name"]]

    def _home_view(self, n):
        concat, col = self.home[n]
        base = self._home_view(concat) if concat in self.home else self.tensors[concat].buffer
        return base[:, col:col + n.shape[0]]

    def _bind_bases(self):
        """Each value as (its C-contiguous buffer, first column); parameters are read from the
        arrays at each call, as they may be reassigned between batches."""
        for n, i in self.slot.items():
            a = self.arrays[i]
            if a is None or n.is_param:
                continue
            root = a if a.base is None else a.base
            col = (a.__array_interface__["data"][0] - root.__array_interface__["data"][0]) // self.itemsize
            self.based[i] = (root, col)


@dataclass
class Counters:
    """What a batch cost in launches and moved bytes; tests and benchmarks read these."""
    kernels: Counter = field(default_factory=Counter)     # op (or fused group) -> launches
    bytes_moved: Counter = field(default_factory=Counter)  # gather/scatter/pull/push -> bytes

    @property
    def total_kernels(self) -> int:
        return sum(self.kernels.values())

    def reset(self):
        self.kernels.clear()
        self.bytes_moved.clear()


@dataclass
class Timings:
    """Seconds spent, split the way the paper splits them; None where a system cannot measure it.
    The engine keeps one (memory_s: its gather/scatter/pull/push), and so does every compared system
    (baselines/base.py)."""
    construct_s: float = 0.0          # building graphs / preprocessing / scheduling
    compute_s: float = 0.0            # forward, backward, update
    memory_s: float | None = None     # part of compute_s spent moving memory, where measurable
    samples: int = 0
    steps: int = 0
    extra: dict = field(default_factory=dict)

    def reset(self):
        self.__init__(memory_s=None if self.memory_s is None else 0.0)

    @contextmanager
    def timing(self, attr: str, sync=None):
        """Adds the block's wall time to `attr`; `sync()` is called before reading the clock (GPU)."""
        if sync:
            sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if sync:
                sync()
            setattr(self, attr, (getattr(self, attr) or 0.0) + time.perf_counter() - t0)

    @property
    def total_s(self) -> float:
        return self.construct_s + self.compute_s


@dataclass
class GatherPlan:
    """Where task rows' child k lives: all present, none present, or some (positions given)."""
    mode: str                     # "all" | "none" | "some"
    child_rows: object = None     # backend index array of the present children's rows
    positions: object = None      # "some": positions within the task that have child k
    unique: bool = True           # children distinct (False in DAGs where two parents share a child)


class EdgePlan:
    """The batch's edges as index arrays: each edge's child row and parent row (the parents in
    row order), and the first edge of each row (`offset` on the host, `first` on the device)."""

    def __init__(self, sched: Schedule, backend):
        self.child = backend.index(sched.edge_child)
        self.parent = backend.index(sched.edge_parent)
        self.parent_host = sched.edge_parent
        self.offset = sched.edge_offset
        self.first = backend.index(sched.edge_offset)
        self.unique = _unique(sched.edge_child)         # False in DAGs: a child under two parents
        self.degree = sched.degree


class MessagePlans:
    """Per task and child slot k: the index arrays gather and its gradient scatter use."""

    def __init__(self, sched: Schedule, backend):
        self.plans: list[list[GatherPlan]] = []
        distinct = _unique(sched.edge_child)       # a tree's children are: then so is every subset
        rows = sched.child_rows
        present = rows >= 0
        # children present per task and slot, for all tasks at once
        before = np.zeros((len(rows) + 1, rows.shape[1]), dtype=np.int64)
        np.cumsum(present, axis=0, out=before[1:])
        counts = (before[sched.bounds[1:]] - before[sched.bounds[:-1]]).tolist()
        by_slot = rows.T.copy()                    # each slot's rows contiguous: its "all" plans are views
        none = GatherPlan("none")
        for (a, b), count in zip(sched.tasks(), counts):
            per_k = []
            for k, c in enumerate(count):
                if c == b - a:
                    idx = by_slot[k, a:b]
                    per_k.append(GatherPlan("all", backend.index(idx), None, distinct or _unique(idx)))
                elif c == 0:
                    per_k.append(none)
                else:
                    kept = by_slot[k, a:b][present[a:b, k]]
                    per_k.append(GatherPlan("some", backend.index(kept),
                                            backend.index(np.flatnonzero(present[a:b, k])), distinct or _unique(kept)))
            self.plans.append(per_k)


def _unique(idx: np.ndarray) -> bool:
    """No index repeats (rows are below the batch's row count: a count per row, no sort)."""
    return len(idx) == 0 or int(np.bincount(idx).max()) <= 1


class PullPlan:
    """Rows that carry an external input and their token ids (the embedding gradient adds
    each row into its token's row). `pull_all`: every row pulls, its "token" its vertex id (a
    caller's inputs, one row per vertex)."""

    def __init__(self, sched: Schedule, backend, read_tasks: np.ndarray, pull_all: bool = False):
        has = np.ones(sched.num_rows, dtype=bool) if pull_all else sched.tokens >= 0
        rows = np.flatnonzero(has)
        self.num_rows = len(rows)
        # rows are in task order, so on trees the leaves (with words) are a prefix: one take
        self.prefix = len(rows) if (rows == np.arange(len(rows))).all() else None
        self.rows, self.rows_host = backend.index(rows), rows
        tokens = sched.order[rows] if pull_all else sched.tokens[rows]
        self.tokens = backend.index(tokens)
        # the embedding's sparse gradient: one summed row per distinct token (optim.py)
        unique, slot = np.unique(tokens, return_inverse=True)
        self.unique_tokens, self.token_slot = backend.index(unique), backend.index(slot)
        self.unique_host, self.token_slot_host = unique, slot       # for token sharing (tokens.py)
        # rows without input in the tasks that read pull(): the only ones that must hold zeros
        read_rows = np.repeat(read_tasks, np.diff(sched.bounds))
        self.zero_rows = backend.index(np.flatnonzero(read_rows & ~has))


class LossPlan:
    """Rows that carry a label (the loss reads their pushed outputs)."""

    def __init__(self, sched: Schedule, backend):
        rows = np.flatnonzero(sched.labels >= 0)
        self.all_rows = len(rows) == sched.num_rows
        self.rows = backend.index(rows)
        self.labels = backend.index(sched.labels[rows])
