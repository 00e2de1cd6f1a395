"""TensorFlow Fold's depth-based dynamic batching (its "loom"), reproduced in PyTorch.

Preprocessing (Fold's graph construction, timed as construct_s) gives every vertex its depth
(leaves 0, a parent one above its highest child) and batches all vertices of one depth across the
batch. A loom op at depth d reads only depth d-1's outputs, so a child at a lower depth is carried
up level by level by identity pass-through copies; these copies are Fold's real overhead and are
executed, not optimized away. Execution loops over depths: gather the inputs from the previous
depth's concatenated outputs (index_select), run the cell once over the whole depth, concatenate
the cells' outputs with the copies. Copies are exact, so the loss is the spec's.

workers: 1 = Fold-1 (preprocessing in this process); N > 1 = Fold-N, the batch's samples split
across N worker processes; 0 = one worker per core.
"""
from __future__ import annotations

import multiprocessing
import os
import weakref
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from cavs import datasets
from cavs.graphs import Graph, InputError, levels
from .pytorch_sample import CELLS, TorchSystem, graph_levels, mean_cross_entropy, read_batch, state_width


@dataclass
class Level:
    """One depth of a sample's (or a batch's) schedule. Output rows: [cells..., copies...]."""
    tokens: np.ndarray     # (cells,) token of each cell's vertex, -1: none
    labels: np.ndarray     # (cells,) loss target, -1: none
    children: np.ndarray   # (cells, arity) rows of the previous depth's output, -1: absent (zeros)
    copies: np.ndarray     # (copies,) rows of the previous depth's output passed through unchanged


def schedule(g: Graph, depth: np.ndarray | None = None) -> list[Level]:
    """Depth-by-depth schedule of one sample, pass-through copies included; `depth`: the graph's
    vertex levels where the batch reader computed them already."""
    depth = levels(g.children) if depth is None else depth
    parent, slot = np.nonzero(g.children >= 0)
    # a vertex must stay available up to one below its highest parent (the root: its own depth)
    top = depth.copy()
    np.maximum.at(top, g.children[parent, slot], depth[parent] - 1)
    row = np.full(g.num_vertices, -1, dtype=np.int64)   # each vertex's row in the previous depth
    out = []
    for d in range(int(depth.max()) + 1):
        cells = np.flatnonzero(depth == d)
        carried = np.flatnonzero((depth < d) & (top >= d))
        kids = g.children[cells]
        out.append(Level(g.tokens[cells], g.labels[cells], np.where(kids >= 0, row[kids], -1), row[carried]))
        row[cells] = np.arange(len(cells))
        row[carried] = len(cells) + np.arange(len(carried))
    return out


def merge(schedules: list[list[Level]]) -> list[Level]:
    """The batch's schedule: per depth, all samples' cells first, then all samples' copies."""
    n = len(schedules)
    # per sample, where its rows of the previous depth went: its cell count, first cell row, first copy row
    cells_before, cell_at, copy_at = (np.zeros(n, dtype=np.int64) for _ in range(3))

    def remap(local, i):
        batch_row = np.where(local < cells_before[i], cell_at[i] + local, copy_at[i] + local - cells_before[i])
        return np.where(local < 0, -1, batch_row)

    merged = []
    for d in range(max(len(s) for s in schedules)):
        ids = [i for i, s in enumerate(schedules) if d < len(s)]   # shallower samples have ended
        here = [schedules[i][d] for i in ids]
        merged.append(Level(np.concatenate([lv.tokens for lv in here]),
                            np.concatenate([lv.labels for lv in here]),
                            np.concatenate([remap(lv.children, i) for i, lv in zip(ids, here)]),
                            np.concatenate([remap(lv.copies, i) for i, lv in zip(ids, here)])))
        cells = np.array([len(lv.tokens) for lv in here], dtype=np.int64)
        copies = np.array([len(lv.copies) for lv in here], dtype=np.int64)
        cells_before[ids] = cells
        cell_at[ids] = np.cumsum(cells) - cells
        copy_at[ids] = cells.sum() + np.cumsum(copies) - copies
    return merged


def _schedule_chunk(workload: str, samples: list, arity: int, first_index: int) -> list[list[Level]]:
    """A Fold-N worker's share: its samples' graphs and schedules."""
    graphs, forest = read_batch(workload, samples, arity, first_index)
    return [schedule(g, depth) for g, depth in zip(graphs, graph_levels(forest))]


@dataclass
class DepthOp:
    """One depth, as index tensors on the device."""
    cells: int
    token_rows: torch.Tensor   # cells that pull an embedding row ...
    token_ids: torch.Tensor    # ... and which row
    children: list             # per child slot: rows of the previous output (its last row + 1 = zeros)
    absent_child: bool         # some cell lacks a child: append a zero row before gathering
    copies: torch.Tensor
    label_rows: torch.Tensor   # cells with a loss


@dataclass
class FoldBatch:
    ops: list[DepthOp]
    used_rows: torch.Tensor    # the embedding rows the batch reads (token ids are positions in it)
    targets: torch.Tensor      # labels of the label_rows, depth after depth
    num_samples: int
    num_cells: int
    num_copies: int


class FoldSystem(TorchSystem):
    name = "fold"
    workloads = ("tree_fc", "tree_lstm")

    def __init__(self, workload: str, workers: int = 1, **kwargs):
        super().__init__(workload, **kwargs)
        if not isinstance(workers, int) or workers < 0:
            raise ValueError(f"fold: workers must be 0 (one per core) or a positive count, got {workers!r}")
        self.workers = workers or os.cpu_count()
        self.timings.extra["workers"] = self.workers
        self.pool = None
        if self.workers > 1:
            if workload == "tree_lstm":
                datasets.sst_vocab()   # load it once here, so the forked workers inherit it
            # fork: workers start fast and run only NumPy preprocessing, never torch
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
            self.pool.submit(os.getpid).result()   # starts the workers now, not inside a timed prepare()
            weakref.finalize(self, self.pool.shutdown, cancel_futures=True)

    def prepare(self, samples: list) -> FoldBatch:
        with self.timings.timing("construct_s"):
            arity = self.sizes.arity
            if not samples:
                raise InputError("empty batch: no samples were given")
            if self.pool is None:
                schedules = _schedule_chunk(self.workload, samples, arity, 0)
            else:
                size = -(-len(samples) // self.workers)   # ceil: at most one chunk per worker
                futures = [self.pool.submit(_schedule_chunk, self.workload, samples[a:a + size], arity, a)
                           for a in range(0, len(samples), size)]
                schedules = [s for f in futures for s in f.result()]
            batch = self.to_device(merge(schedules), len(samples))
        # Fold's redundancy, for the record: pass-through copies next to the real cell evaluations
        for key, count in (("cells", batch.num_cells), ("copies", batch.num_copies)):
            self.timings.extra[key] = self.timings.extra.get(key, 0) + count
        return batch

    def to_device(self, merged: list[Level], num_samples: int) -> FoldBatch:
        used_rows, tokens = self.used_rows(*(lv.tokens for lv in merged))
        ops, rows = [], 0   # rows: output rows of the previous depth
        for lv, local in zip(merged, tokens):
            token_rows = np.flatnonzero(lv.tokens >= 0)
            label_rows = np.flatnonzero(lv.labels >= 0)
            kids = np.where(lv.children >= 0, lv.children, rows)
            ops.append(DepthOp(len(lv.tokens), self.index(token_rows), self.index(local[token_rows]),
                               [self.index(kids[:, k]) for k in range(kids.shape[1])],
                               bool((lv.children < 0).any()), self.index(lv.copies), self.index(label_rows)))
            rows = len(lv.tokens) + len(lv.copies)
        targets = np.concatenate([lv.labels[lv.labels >= 0] for lv in merged])
        return FoldBatch(ops, used_rows, self.index(targets), num_samples,
                         sum(len(lv.tokens) for lv in merged), sum(len(lv.copies) for lv in merged))

    def loss(self, batch: FoldBatch, emb: torch.Tensor) -> torch.Tensor:
        p, cell, h = self.params, CELLS[self.workload], self.hidden
        width = state_width(self.workload, h)
        like = dict(dtype=self.torch_dtype, device=self.torch_device)
        prev, outputs = None, []
        for op in batch.ops:
            x = torch.zeros(op.cells, self.sizes.embed, **like)
            if len(op.token_rows):
                x = x.index_copy(0, op.token_rows, emb.index_select(0, op.token_ids))
            if prev is None:                     # depth 0: leaves, no children
                kids = [torch.zeros(op.cells, width, **like)] * len(op.children)
            else:
                source = torch.cat([prev, torch.zeros(1, width, **like)]) if op.absent_child else prev
                kids = [source.index_select(0, rows) for rows in op.children]
            out = cell(p, x, *kids)
            outputs.append(out[:, :h].index_select(0, op.label_rows))
            prev = torch.cat([out, prev.index_select(0, op.copies)]) if len(op.copies) else out
        return mean_cross_entropy(p, torch.cat(outputs), batch.targets)
