"""PyTorch, one sample and one vertex at a time: the imperative reference every system is checked against.

Each vertex runs the docs/workloads.md cell on (1, h) tensors in an order where children come first,
skipping the products with absent (zero) inputs as a user writes it for one vertex;
autograd records everything, one backward over the batch's mean loss, one SGD step with the
gradients clipped to a global L2 norm (docs/workloads.md's training rule).
`TorchSystem` and the cell functions are shared with the other PyTorch baselines (cudnn_lstm.py,
fold.py), so all three run the same math and the same parameter handling.

The per-sample system also takes the Adagrad option (base.Adagrad, SST training to accuracy):
torch.optim.Adagrad(weight_decay=...) on the dense parameters, and for the embedding, whose
gradient is its looked-up rows (see TorchSystem.step), torch's sparse-Adagrad code path with the L2
term added on those rows (torch.optim.Adagrad refuses weight_decay with sparse gradients, so those
few lines are written out here). No gradient clipping.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from cavs import workloads
from cavs.graphs import Forest, Graph, InputError, make_forest
from .base import System, root_of


# ---------------------------------------------------------------- cells (rows = vertices, any batch)
# A state is [h; c] (LSTMs) or h (Tree-FC), one row per vertex; absent children are zero rows.

def lstm_cell(p, x, child):
    h_prev, c_prev = child.chunk(2, dim=1)
    i, f, o, u = (x @ p["Wx"] + h_prev @ p["Wh"] + p["b"]).chunk(4, dim=1)
    c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(u)
    return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], dim=1)


def tree_fc_cell(p, x, left, right):
    return torch.tanh(torch.cat([left, right], dim=1) @ p["W"] + x + p["b"])


def tree_lstm_cell(p, x, left, right):
    hl, cl = left.chunk(2, dim=1)
    hr, cr = right.chunk(2, dim=1)
    i, fl, fr, o, u = (x @ p["Wx"] + torch.cat([hl, hr], dim=1) @ p["Uh"] + p["b"]).chunk(5, dim=1)
    c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * cl + torch.sigmoid(fr) * cr
    return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], dim=1)


CELLS = {"fixed_lstm": lstm_cell, "var_lstm": lstm_cell, "tree_fc": tree_fc_cell, "tree_lstm": tree_lstm_cell}


# The same cells as a user writes them for one vertex: an absent input is None and the products
# with it are skipped (the first step's zero state, a leaf's absent children, an internal vertex's
# absent token), as DyNet's cells and the engine's support analysis skip them. Adding the exact
# zeros they would have produced changes no bit, so the results equal the cells above.

def lstm_cell_skipping(p, x, child):
    gates = x @ p["Wx"] + p["b"]
    if child is None:
        i, _, o, u = gates.chunk(4, dim=1)
        c = torch.sigmoid(i) * torch.tanh(u)
    else:
        h_prev, c_prev = child.chunk(2, dim=1)
        i, f, o, u = (gates + h_prev @ p["Wh"]).chunk(4, dim=1)
        c = torch.sigmoid(f) * c_prev + torch.sigmoid(i) * torch.tanh(u)
    return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], dim=1)


def _children_h(left, right, width):
    """[h_left; h_right] of the children present (zeros for one absent), None on a leaf."""
    if left is None and right is None:
        return None
    zero = torch.zeros(1, width, dtype=(left if left is not None else right).dtype,
                       device=(left if left is not None else right).device)
    return torch.cat([zero if k is None else k[:, :width] for k in (left, right)], dim=1)


def tree_fc_cell_skipping(p, x, left, right):
    kids = _children_h(left, right, p["b"].shape[0])
    pre = p["b"] if kids is None else kids @ p["W"] + p["b"]
    return torch.tanh(pre if x is None else pre + x).reshape(1, -1)


def tree_lstm_cell_skipping(p, x, left, right):
    h = p["Wout"].shape[0]
    kids = _children_h(left, right, h)
    pre = p["b"]
    if x is not None:
        pre = x @ p["Wx"] + pre
    if kids is not None:
        pre = kids @ p["Uh"] + pre
    i, fl, fr, o, u = pre.expand(1, -1).chunk(5, dim=1)
    c = torch.sigmoid(i) * torch.tanh(u)
    for f, child in ((fl, left), (fr, right)):
        if child is not None:
            c = c + torch.sigmoid(f) * child[:, h:]
    return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], dim=1)


SKIPPING_CELLS = {"fixed_lstm": lstm_cell_skipping, "var_lstm": lstm_cell_skipping,
                  "tree_fc": tree_fc_cell_skipping, "tree_lstm": tree_lstm_cell_skipping}


def state_width(workload: str, hidden: int) -> int:
    return hidden if workload == "tree_fc" else 2 * hidden


def summed_cross_entropy(p, h, targets):
    """Softmax cross-entropy of h Wout + bout, summed over the rows."""
    return F.cross_entropy(h @ p["Wout"] + p["bout"], targets, reduction="sum")


def mean_cross_entropy(p, h, targets):
    """Softmax cross-entropy of h Wout + bout, averaged over the rows (docs/workloads.md's loss when the
    rows are all the batch's loss terms)."""
    return F.cross_entropy(h @ p["Wout"] + p["bout"], targets, reduction="mean")


def read_batch(workload: str, samples: list, arity: int, first_index: int = 0) -> tuple[list[Graph], Forest]:
    """Raw samples as input graphs, checked as the engine checks them: each graph's ranges and
    arity, then acyclicity once over the whole batch, whose longest-path levels come with it
    (`forest.level`, global vertex ids; graph i owns ids offsets[i]:offsets[i + 1]). Errors name
    the sample (file:line where known)."""
    if not samples:
        raise InputError("empty batch: no samples were given")
    graphs = workloads.to_graphs(workload, samples, first_index)
    return graphs, make_forest(graphs, arity)


def graph_levels(forest: Forest) -> list[np.ndarray]:
    """Each graph's own slice of the batch's levels."""
    return np.split(forest.level, forest.offsets[1:-1])


# ---------------------------------------------------------------- shared system plumbing

class TorchSystem(System):
    """Parameters as torch leaf tensors named as in cavs.workloads; threads, device, dtype, SGD, timing."""

    @property
    def blas(self) -> str:
        return "cublas (torch)" if self.device == "cuda" else "mkl (torch)"

    def __init__(self, workload: str, **kwargs):
        super().__init__(workload, **kwargs)
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"{self.name}: device {self.device!r} requested but PyTorch sees no CUDA GPU")
        torch.set_num_threads(self.threads)
        self.torch_device = torch.device(self.device)
        self.torch_dtype = getattr(torch, self.dtype)
        self.sizes = workloads.sizes(workload, self.hidden, self.leaves, self.embed)
        self.timings.extra.update(threads=self.threads, device=self.device)
        self.set_params(workloads.init_params(workload, self.hidden, self.seed, self.dtype, self.leaves,
                                              self.embed))

    def tensor(self, array, dtype=None) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=dtype or self.torch_dtype, device=self.torch_device)

    def index(self, array) -> torch.Tensor:
        return self.tensor(array, torch.int64)

    def check_params(self, params: dict[str, np.ndarray]) -> None:
        for name, shape in workloads.param_shapes(self.workload, self.sizes).items():
            if name not in params:
                raise ValueError(f"{self.name}: parameter {name!r} missing")
            if tuple(np.shape(params[name])) != shape:
                raise ValueError(f"{self.name}: parameter {name!r} has shape {np.shape(params[name])}, want {shape}")

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        self.check_params(params)
        train = self.mode == "train"
        # the embedding table is updated row-wise by step(), never through autograd
        self.params = {k: self.tensor(v).clone().requires_grad_(train and k != "emb") for k, v in params.items()}

    def get_params(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.params.items()}

    def trainable(self) -> list[torch.Tensor]:
        """The dense tensors the SGD step updates (cudnn_lstm.py keeps some inside its nn.LSTM);
        the embedding table is not one of them (see step())."""
        return [v for k, v in self.params.items() if k != "emb"]

    def used_rows(self, *tokens: np.ndarray) -> tuple[torch.Tensor, list[np.ndarray]]:
        """The embedding rows a batch uses (sorted token ids, once each), and each of the given token
        arrays as positions in them (-1 stays -1): the batch's lookups read those rows only."""
        flat = np.concatenate([np.ravel(t) for t in tokens])
        rows, local = np.unique(flat[flat >= 0], return_inverse=True)
        out, k = [], 0
        for t in tokens:
            t = np.asarray(t)
            mine = np.full(t.shape, -1, dtype=np.int64)
            used = t >= 0
            mine[used] = local[k:k + int(used.sum())]
            k += int(used.sum())
            out.append(mine)
        return self.index(rows), out

    def loss(self, batch, emb: torch.Tensor) -> torch.Tensor:
        """The batch's mean loss (summed cross-entropy / number of loss terms); `emb` holds the
        embedding rows `batch.used_rows`, and the batch's token ids are positions in it."""
        raise NotImplementedError

    def step(self, batch) -> float:
        """Train: forward, backward of the batch's mean loss, gradients clipped to a global L2 norm
        of workloads.CLIP_NORM (torch.nn.utils.clip_grad_norm_), p -= lr * g. Returns the mean loss.

        The embedding is looked up as a leaf tensor of the batch's rows (each used row once), so its
        gradient is the dense gradient's nonzero rows, repeated uses summed: it enters the global
        norm as the dense gradient would, and only those rows are updated (index_add_), as
        nn.Embedding(sparse=True) with SGD updates them; a dense update would rewrite the table."""
        table = self.params["emb"]
        with self.timings.timing("compute_s", sync=self.synchronize):
            if self.mode == "train":
                emb = table.index_select(0, batch.used_rows).requires_grad_()
                loss = self.loss(batch, emb)
                loss.backward()
                with torch.no_grad():
                    self.update(batch.used_rows, emb)
            else:
                with torch.no_grad():
                    loss = self.loss(batch, table.index_select(0, batch.used_rows))
            value = loss.item()
        self.timings.steps += 1
        self.timings.samples += batch.num_samples
        return value

    def update(self, rows: torch.Tensor, emb: torch.Tensor) -> None:
        """docs/workloads.md's SGD step on the dense parameters and on the embedding rows `rows`, whose
        gradient is `emb.grad`."""
        params = self.trainable()
        torch.nn.utils.clip_grad_norm_([emb, *params], workloads.CLIP_NORM)
        for p in params:
            p -= workloads.LEARNING_RATE * p.grad
            p.grad = None
        self.params["emb"].index_add_(0, rows, emb.grad, alpha=-workloads.LEARNING_RATE)

    def synchronize(self) -> None:
        if self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)


# ---------------------------------------------------------------- the per-sample system

@dataclass
class SampleBatch:
    graphs: list[Graph]
    orders: list[list[int]]     # per graph: its vertices, children first
    used_rows: torch.Tensor     # the embedding rows the batch reads
    lookups: list               # per graph: its vertices' tokens (vertex order, those with one), as
                                # positions in used_rows
    labelled: list[list[int]]   # per graph: its vertices with a loss term ...
    targets: list               # ... and their labels
    terms: int                  # loss terms in the batch

    @property
    def num_samples(self) -> int:
        return len(self.graphs)


class PytorchSampleSystem(TorchSystem):
    """eps_rule="dynet" (tests only) divides by sqrt(acc + eps^2) instead of sqrt(acc) + eps, as
    DyNet's AdagradTrainer does: it shows that rule is all that separates DyNet's steps from these."""
    name = "pytorch"
    takes_adagrad = True

    def __init__(self, workload: str, eps_rule: str = "torch", **kwargs):
        if eps_rule not in ("torch", "dynet"):
            raise ValueError(f"eps_rule must be 'torch' or 'dynet', got {eps_rule!r}")
        self.eps_rule = eps_rule
        super().__init__(workload, **kwargs)

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        """The parameters, and with the Adagrad option a fresh optimizer state for them."""
        super().set_params(params)
        rule = self.optimizer
        if rule is not None:
            self.dense_adagrad = torch.optim.Adagrad(self.trainable(), lr=rule.lr, weight_decay=rule.weight_decay,
                                                     eps=rule.eps, initial_accumulator_value=0.0, lr_decay=0.0)
            # the embedding's (both rules) and, for eps_rule="dynet", the dense parameters'
            self.accumulators = {k: torch.zeros_like(v, requires_grad=False) for k, v in self.params.items()}

    def update(self, rows: torch.Tensor, emb: torch.Tensor) -> None:
        rule = self.optimizer
        if rule is None:
            return super().update(rows, emb)
        lr, wd, eps = rule.lr, rule.weight_decay, rule.eps
        if self.eps_rule == "torch":
            self.dense_adagrad.step()
        else:
            for k, q in self.params.items():
                if k != "emb":
                    g = q.grad + wd * q
                    self.accumulators[k].addcmul_(g, g)
                    q.sub_(lr * g / (self.accumulators[k] + eps * eps).sqrt())
        self.dense_adagrad.zero_grad(set_to_none=True)
        # the embedding: torch's sparse Adagrad code path, plus L2 on the rows used
        table, acc = self.params["emb"], self.accumulators["emb"]
        values = emb.grad
        if wd:
            values = values + wd * table.index_select(0, rows)
        acc.index_add_(0, rows, values * values)
        if self.eps_rule == "torch":
            std = acc.index_select(0, rows).sqrt_().add_(eps)
        else:
            std = acc.index_select(0, rows).add_(eps * eps).sqrt_()
        table.index_add_(0, rows, values / std, alpha=-lr)

    def prepare(self, samples: list) -> SampleBatch:
        with self.timings.timing("construct_s"):
            graphs, forest = read_batch(self.workload, samples, self.sizes.arity)
            # graphs may number vertices in any order; a stable sort by level puts children first
            orders = [np.argsort(level, kind="stable").tolist() for level in graph_levels(forest)]
            labelled = [np.flatnonzero(g.labels >= 0) for g in graphs]
            rows, local = self.used_rows(*(g.tokens[g.tokens >= 0] for g in graphs))
            batch = SampleBatch(graphs, orders, rows, [self.index(t) for t in local],
                                [v.tolist() for v in labelled],
                                [self.index(g.labels[v]) for g, v in zip(graphs, labelled)],
                                sum(len(v) for v in labelled))
        return batch

    def loss(self, batch: SampleBatch, emb: torch.Tensor) -> torch.Tensor:
        return sum(self.sample_loss(batch, i, emb) for i in range(batch.num_samples)) / batch.terms

    def predict(self, batch: SampleBatch) -> np.ndarray:
        p = self.params
        with torch.no_grad():
            emb = p["emb"].index_select(0, batch.used_rows)
            roots = [self.sample_states(batch, i, emb)[root_of(g)][:, :self.hidden] for i, g in enumerate(batch.graphs)]
            return np.stack([torch.softmax(h @ p["Wout"] + p["bout"], dim=1)[0].cpu().numpy() for h in roots])

    def sample_loss(self, batch: SampleBatch, i: int, emb: torch.Tensor) -> torch.Tensor:
        state = self.sample_states(batch, i, emb)
        h = torch.cat([state[v][:, :self.hidden] for v in batch.labelled[i]])
        return summed_cross_entropy(self.params, h, batch.targets[i])

    def sample_states(self, batch: SampleBatch, i: int, emb: torch.Tensor) -> list:
        """Sample i's vertex states, in its own vertex order; `emb` holds the rows batch.used_rows."""
        g, p, cell = batch.graphs[i], self.params, SKIPPING_CELLS[self.workload]
        # one embedding lookup per sample (a lookup per vertex would cost, in the backward, a zero
        # tensor the size of the table each), split into rows that share one backward node
        rows = iter(emb.index_select(0, batch.lookups[i]).unsqueeze(1).unbind(0))
        tokens, children = g.tokens.tolist(), g.children.tolist()
        x = [next(rows) if t >= 0 else None for t in tokens]     # None: absent, products skipped
        state = [None] * g.num_vertices
        for v in batch.orders[i]:
            state[v] = cell(p, x[v], *(state[c] if c >= 0 else None for c in children[v]))
        return state
