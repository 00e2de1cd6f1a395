"""PyTorch batched by level: the strongest baseline a PyTorch user writes today for trees.

As the widely copied unbounce/pytorch-tree-lstm batches trees: per batch, a node order by level
(longest path from a leaf, computed once for the batch by the shared reader), the states of all
the batch's vertices in one buffer with rows in that order, and per level one cell call over all
its vertices: the children's states gathered with `index_select`, the children's contributions to
the cell state summed with `index_add` where only some rows have children, the level's output
written into its block of the buffer; autograd records it all and computes the backward.

As a user writes it, the products with absent inputs are skipped (a level's rows without a token
skip `x Wx`, rows without children skip the state matmul; on SST and Tree-FC a level is all leaves
or all internal vertices), so unlike `fold` no zeros are multiplied and nothing is copied up
between levels. Loss, clipping and the row-wise embedding update are TorchSystem's
(pytorch_sample.py), so the numbers are the other PyTorch systems'.

`compile`: False (default) = eager; True = the level cell through `torch.compile(dynamic=True)`
(Inductor's C++ kernels on a CPU). Measured on the 2-core VM, one thread, bs 64, after warm-up,
interleaved in one process: compiled steps were 1.08x faster on Tree-LSTM h = 512 (128 trees),
1.05x on Tree-FC h = 128 (128 trees), 1.15-1.7x on Tree-LSTM h = 64 (256 trees; noisy), with the
same losses to float32 rounding; but compiling costs 27-85 s in the first step of every process
(once per dtype and input pattern), more than a `cpu`-profile cell's whole 90 s limit and, for a
whole SST epoch at h = 512 (about 250 s eager), as much as the 8% it saves. So eager is kept as
the benchmarked default, and `compile=True` stays an option.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .pytorch_sample import TorchSystem, mean_cross_entropy, read_batch

@dataclass
class LevelOp:
    """One level: rows start:stop of the buffer."""
    start: int
    stop: int
    token_rows: torch.Tensor | None   # level rows with a token (None: all rows have one) ...
    tokens: torch.Tensor | None       # ... and their positions in used_rows (None: no row has one)
    kid_rows: torch.Tensor | None     # level rows with children (None: all rows have them) ...
    kids: list | None                 # ... per child slot, the buffer row of that child (the last
                                      #     buffer row, kept zero, for an absent one); None: no row


@dataclass
class LevelBatch:
    used_rows: torch.Tensor     # the embedding rows the batch reads
    ops: list[LevelOp]
    label_rows: torch.Tensor    # buffer rows with a loss term ...
    targets: torch.Tensor       # ... and their labels
    num_vertices: int
    num_samples: int


def _tree_lstm_cell(p, h: int, n: int, x, x_rows, kids, kid_rows):
    """One level of n Tree-LSTM vertices. x: the embeddings of the rows x_rows (None: all rows),
    or None (no row has a token); kids: per child slot, the children's [h; c] for the rows
    kid_rows (None: all rows), or None (no row has children). Returns the level's [h; c] rows."""
    pre = p["b"].expand(n, -1)
    if x is not None:
        pre = pre + x @ p["Wx"] if x_rows is None else pre.index_add(0, x_rows, x @ p["Wx"])
    if kids is not None:
        state = torch.cat([k[:, :h] for k in kids], dim=1) @ p["Uh"]
        pre = pre + state if kid_rows is None else pre.index_add(0, kid_rows, state)
    i, fl, fr, o, u = pre.chunk(5, dim=1)
    c = torch.sigmoid(i) * torch.tanh(u)
    if kids is not None:     # the children's cell states, each through its own forget gate
        forget = (fl, fr)
        summed = sum(torch.sigmoid(forget[k] if kid_rows is None else forget[k].index_select(0, kid_rows))
                     * kid[:, h:] for k, kid in enumerate(kids))
        c = c + summed if kid_rows is None else c.index_add(0, kid_rows, summed)
    return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], dim=1)


def _tree_fc_cell(p, h: int, n: int, x, x_rows, kids, kid_rows):
    """One level of n Tree-FC vertices; arguments as _tree_lstm_cell's, states h only."""
    pre = p["b"].expand(n, -1)
    if x is not None:
        pre = pre + x if x_rows is None else pre.index_add(0, x_rows, x)
    if kids is not None:
        state = torch.cat(kids, dim=1) @ p["W"]
        pre = pre + state if kid_rows is None else pre.index_add(0, kid_rows, state)
    return torch.tanh(pre)


class PytorchLevelsSystem(TorchSystem):
    name = "pytorch-levels"
    workloads = ("tree_fc", "tree_lstm")

    def __init__(self, workload: str, compile: bool = False, **kwargs):
        super().__init__(workload, **kwargs)
        cell = {"tree_lstm": _tree_lstm_cell, "tree_fc": _tree_fc_cell}[workload]
        self.compiled = bool(compile)
        self.cell = torch.compile(cell, dynamic=True) if self.compiled else cell
        self.timings.extra["compiled"] = self.compiled

    def prepare(self, samples: list) -> LevelBatch:
        with self.timings.timing("construct_s"):
            graphs, forest = read_batch(self.workload, samples, self.sizes.arity)
            n = forest.num_vertices
            order = np.argsort(forest.level, kind="stable")          # the node order, by level
            row = np.empty(n, dtype=np.int64)
            row[order] = np.arange(n)                                 # each vertex's buffer row
            bounds = np.searchsorted(forest.level[order], np.arange(int(forest.level.max()) + 2))
            used_rows, (tokens,) = self.used_rows(forest.tokens[order])
            children = forest.children[order]
            ops = []
            for start, stop in zip(bounds[:-1], bounds[1:]):
                tok, kids = tokens[start:stop], children[start:stop]
                with_tok = np.flatnonzero(tok >= 0)
                with_kids = np.flatnonzero((kids >= 0).any(axis=1))
                whole = stop - start
                ops.append(LevelOp(
                    int(start), int(stop),
                    None if len(with_tok) == whole else self.index(with_tok),
                    self.index(tok[with_tok]) if len(with_tok) else None,
                    None if len(with_kids) == whole else self.index(with_kids),
                    [self.index(np.where(kids[with_kids, k] >= 0, row[kids[with_kids, k]], n))
                     for k in range(kids.shape[1])] if len(with_kids) else None))
            labelled = np.flatnonzero(forest.labels[order] >= 0)
            batch = LevelBatch(used_rows, ops, self.index(labelled), self.index(forest.labels[order][labelled]),
                               n, len(graphs))
        return batch

    def loss(self, batch: LevelBatch, emb: torch.Tensor) -> torch.Tensor:
        p, h = self.params, self.hidden
        width = h if self.workload == "tree_fc" else 2 * h
        # every vertex's state, rows in level order, plus one zero row for absent children
        states = torch.zeros(batch.num_vertices + 1, width, dtype=self.torch_dtype, device=self.torch_device)
        for op in batch.ops:
            x = None if op.tokens is None else emb.index_select(0, op.tokens)
            kids = None if op.kids is None else [states.index_select(0, k) for k in op.kids]
            states[op.start:op.stop] = self.cell(p, h, op.stop - op.start, x, op.token_rows, kids, op.kid_rows)
        return mean_cross_entropy(p, states[:, :h].index_select(0, batch.label_rows), batch.targets)
