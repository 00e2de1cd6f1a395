"""SST sentiment training (issue 13): one small trainer per system, all with the same semantics.

Every trainer has the same interface, so experiments/sst.py never special-cases a system:

    t = TRAINERS[name](hidden=150, embed=300, dtype="float32", lr=0.05, weight_decay=1e-4,
                       threads=1, seed=0, eval_batch=100)
    t.set_params(cavs.workloads.init_params("tree_lstm", hidden, seed, dtype, embed=embed))
    loss = t.train_step(lines)     # one Adagrad step on a batch of SST lines; the loss before it
    probs = t.predict(lines)       # (len(lines), 5) softmax probabilities at each tree's root
    t.get_params()                 # {name: numpy array}, names as in cavs.workloads

The model is WORKLOADS.md's binary Tree-LSTM (state [h; c], gates i, fl, fr, o, u), the loss is
the softmax cross-entropy of `h Wout + bout` at every vertex, averaged over the batch's labelled
vertices (in SST: all of them). The optimizer is torch.optim.Adagrad's rule in every system:

    g <- grad + weight_decay * p;  acc <- acc + g^2;  p <- p - lr * g / (sqrt(acc) + 1e-10)

with the accumulator starting at 0, and for the embedding only on the rows some tree of the batch
looked up (rows no tree used are untouched: no decay, no accumulator change), as PyTorch's sparse
embedding gradients do with Adagrad. How each system gets there:

  cavs     the engine's own optimizer, cavs.optim.Adagrad(lr, weight_decay) (same rule, by spec)
  pytorch  torch.optim.Adagrad(weight_decay=...) on the dense parameters; the embedding's sparse
           gradient (F.embedding(sparse=True)) updated by torch's own sparse-Adagrad code path with
           the L2 term added on the rows used (torch.optim.Adagrad refuses weight_decay with
           sparse gradients, so those few lines are written out here)
  dynet    dy.AdagradTrainer, with the L2 term put into the graph: (wd/2) ||p||^2 for the dense
           parameters and for each embedding row the batch looks up (DyNet's own weight_decay is
           a global multiplicative decay of all weights, a different rule). DyNet's trainer updates
           only the looked-up rows of a lookup parameter (sparse updates, its default) and divides
           by sqrt(acc + eps) rather than sqrt(acc) + eps; eps = 1e-20 = (1e-10)^2 makes that the
           same to within float32 rounding except for gradients below ~1e-10. Gradient clipping
           (DyNet's default: norm 5) is switched off, as in the other systems (Tai et al. use none).
"""
from __future__ import annotations

import numpy as np

from cavs import workloads
from cavs.graphs import levels, validate

CLASSES = workloads.SST_CLASSES
EPS = 1e-10


def _graphs(lines):
    graphs = workloads.to_graphs("tree_lstm", list(lines))
    for g in graphs:
        validate(g, 2)
    return graphs


def root_of(g) -> int:
    """The root of an SST tree: the one vertex that is nobody's child (the last, in post-order)."""
    is_child = np.zeros(g.num_vertices, dtype=bool)
    kids = g.children[g.children >= 0]
    is_child[kids] = True
    roots = np.flatnonzero(~is_child)
    if len(roots) != 1:
        raise ValueError(f"{g.name}: expected one root, found {len(roots)}")
    return int(roots[0])


class Trainer:
    name = "system"
    supports_float64 = True

    def __init__(self, *, hidden: int = 150, embed: int = 300, dtype: str = "float32", lr: float = 0.05,
                 weight_decay: float = 1e-4, threads: int = 1, seed: int = 0, eval_batch: int = 100,
                 batch_size: int = 25):
        self.hidden, self.embed, self.dtype = hidden, embed, np.dtype(dtype).name
        self.lr, self.weight_decay, self.threads, self.seed = lr, weight_decay, threads, seed
        self.eval_batch, self.batch_size = eval_batch, batch_size

    def initial_params(self) -> dict[str, np.ndarray]:
        return workloads.init_params("tree_lstm", self.hidden, self.seed, self.dtype, embed=self.embed)

    def set_params(self, params) -> None:
        raise NotImplementedError

    def get_params(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def train_step(self, lines) -> float:
        raise NotImplementedError

    def predict_batch(self, lines) -> np.ndarray:
        raise NotImplementedError

    def warmup(self, lines) -> None:
        """Untimed first-call costs that change no parameter or optimizer state (default: a predict)."""
        self.predict_batch(lines)

    def predict(self, lines) -> np.ndarray:
        """Root probabilities, (len(lines), 5), computed `eval_batch` trees at a time."""
        lines = list(lines)
        out = [self.predict_batch(lines[i:i + self.eval_batch]) for i in range(0, len(lines), self.eval_batch)]
        return np.concatenate(out) if out else np.zeros((0, CLASSES))


# ---------------------------------------------------------------- Cavs

class CavsTrainer(Trainer):
    name = "cavs"

    def __init__(self, **kw):
        super().__init__(**kw)
        import cavs
        self.cavs = cavs
        self.model = cavs.models.build("tree_lstm", hidden=self.hidden, embed=self.embed, seed=self.seed,
                                       dtype=self.dtype, reduction="mean")
        self.engine = cavs.Engine(self.model, threads=self.threads,
                                  optimizer=cavs.optim.Adagrad(lr=self.lr, weight_decay=self.weight_decay))
        self.set_params(self.initial_params())

    def set_params(self, params):
        for name, value in params.items():
            self.engine.params[name] = np.asarray(value, dtype=self.dtype)

    def get_params(self):
        return {name: np.array(self.engine.params[name]) for name in self.engine.params}

    def train_step(self, lines):
        return float(self.engine.step(self.model.make_batch(list(lines))))

    def warmup(self, lines):
        """Compiles the fused kernels of F and dF: forward and backward without an update."""
        self.engine.loss_and_grads(self.model.make_batch(list(lines)))
        self.predict_batch(lines)

    def predict_batch(self, lines):
        probs = self.engine.predict(self.model.make_batch(list(lines)))
        # rows in each tree's own vertex order (post-order): the root is the last row
        return np.stack([np.asarray(p)[-1] for p in probs])


# ---------------------------------------------------------------- PyTorch, one tree and one vertex at a time

class PytorchTrainer(Trainer):
    """eps_rule="dynet" (tests only) divides by sqrt(acc + eps^2) instead of sqrt(acc) + eps, as
    DyNet's AdagradTrainer does: it shows that rule is all that separates DyNet's steps from these."""
    name = "pytorch"

    def __init__(self, eps_rule: str = "torch", **kw):
        super().__init__(**kw)
        if eps_rule not in ("torch", "dynet"):
            raise ValueError(f"eps_rule must be 'torch' or 'dynet', got {eps_rule!r}")
        self.eps_rule = eps_rule
        import torch
        # the project's per-sample cell: products with an absent input (a leaf's children, an
        # internal vertex's word) are skipped, as a user writes it and as DyNet's cell does
        from baselines.pytorch_sample import tree_lstm_cell_skipping
        self.torch, self.cell = torch, tree_lstm_cell_skipping
        torch.set_num_threads(self.threads)
        self.tdtype = getattr(torch, self.dtype)
        self.set_params(self.initial_params())

    def set_params(self, params):
        torch = self.torch
        self.p = {k: torch.tensor(np.asarray(v), dtype=self.tdtype).requires_grad_() for k, v in params.items()}
        dense = [v for k, v in self.p.items() if k != "emb"]
        self.opt = torch.optim.Adagrad(dense, lr=self.lr, weight_decay=self.weight_decay, eps=EPS,
                                       initial_accumulator_value=0.0, lr_decay=0.0)
        self.acc = {k: torch.zeros_like(v, requires_grad=False) for k, v in self.p.items()}

    def get_params(self):
        return {k: v.detach().numpy().copy() for k, v in self.p.items()}

    def _tree_states(self, g):
        """h of every vertex (rows in the graph's vertex order), children before parents."""
        torch, p = self.torch, self.p
        F = torch.nn.functional
        leaves = np.flatnonzero(g.tokens >= 0)
        # one sparse embedding lookup per tree, split into rows (None: no word, product skipped)
        rows = iter(F.embedding(torch.as_tensor(g.tokens[leaves]), p["emb"], sparse=True).unsqueeze(1).unbind(0))
        x = [next(rows) if t >= 0 else None for t in g.tokens.tolist()]
        children = g.children.tolist()
        state = [None] * g.num_vertices
        for v in np.argsort(levels(g.children), kind="stable").tolist():
            state[v] = self.cell(p, x[v], *(state[c] if c >= 0 else None for c in children[v]))
        return state

    def train_step(self, lines):
        torch, p = self.torch, self.p
        F = torch.nn.functional
        total, count = 0.0, 0
        for g in _graphs(lines):
            state = self._tree_states(g)
            labelled = np.flatnonzero(g.labels >= 0).tolist()
            hs = torch.cat([state[v][:, :self.hidden] for v in labelled])
            logits = hs @ p["Wout"] + p["bout"]
            total = total + F.cross_entropy(logits, torch.as_tensor(g.labels[labelled]), reduction="sum")
            count += len(labelled)
        loss = total / count
        loss.backward()
        with torch.no_grad():
            if self.eps_rule == "torch":
                self.opt.step()
            else:
                for k, q in p.items():
                    if k != "emb":
                        g = q.grad + self.weight_decay * q
                        self.acc[k].addcmul_(g, g)
                        q.sub_(self.lr * g / (self.acc[k] + EPS * EPS).sqrt())
            self.opt.zero_grad(set_to_none=True)
            # the embedding: torch's sparse Adagrad code path, plus L2 on the rows used
            emb, acc = p["emb"], self.acc["emb"]
            grad = emb.grad.coalesce()
            rows, values = grad.indices()[0], grad.values()
            if self.weight_decay:
                values = values + self.weight_decay * emb.index_select(0, rows)
            acc.index_add_(0, rows, values * values)
            if self.eps_rule == "torch":
                std = acc.index_select(0, rows).sqrt_().add_(EPS)
            else:
                std = acc.index_select(0, rows).add_(EPS * EPS).sqrt_()
            emb.index_add_(0, rows, values / std, alpha=-self.lr)
            emb.grad = None
        return float(loss.item())

    def predict_batch(self, lines):
        torch, p = self.torch, self.p
        out = []
        with torch.no_grad():
            for g in _graphs(lines):
                h = self._tree_states(g)[root_of(g)][:, :self.hidden]
                out.append(torch.softmax(h @ p["Wout"] + p["bout"], dim=1)[0].numpy())
        return np.stack(out)


# ---------------------------------------------------------------- DyNet with autobatching

class DynetTrainer(Trainer):
    name = "dynet"
    supports_float64 = False

    def __init__(self, autobatch: int = 1, **kw):
        super().__init__(**kw)
        from baselines.dynet_autobatch import _dynet, pool_mb
        # the memory pool is fixed at DyNet's import: size it for the larger of the two batch kinds
        self.dy = dy = _dynet(autobatch, self.seed, pool_mb("tree_lstm", self.hidden,
                                                            max(self.batch_size, self.eval_batch), 256))
        self.sizes = workloads.sizes("tree_lstm", self.hidden, embed=self.embed)
        self.shapes = workloads.param_shapes("tree_lstm", self.sizes)
        self.model = dy.ParameterCollection()
        # DyNet multiplies column vectors: every matrix but the embedding table is stored transposed
        self.params = {name: (self.model.add_lookup_parameters(shape, name=name) if name == "emb"
                              else self.model.add_parameters(shape[::-1], name=name))
                       for name, shape in self.shapes.items()}
        self.trainer = dy.AdagradTrainer(self.model, learning_rate=self.lr, eps=EPS * EPS)
        self.trainer.set_clip_threshold(0)       # no gradient clipping (DyNet's default clips at 5)
        self.trainer.set_sparse_updates(True)    # only looked-up embedding rows (DyNet's default)
        self.set_params(self.initial_params())

    def set_params(self, params):
        for name, q in self.params.items():
            value = np.asarray(params[name], dtype=np.float32)
            if value.shape != self.shapes[name]:
                raise ValueError(f"parameter {name}: shape {value.shape}, expected {self.shapes[name]}")
            if name == "emb":
                q.init_from_array(value)
            else:
                q.set_value(np.ascontiguousarray(value.T))

    def get_params(self):
        return {name: (q.as_array() if name == "emb" else q.as_array().T).astype(np.float32)
                for name, q in self.params.items()}

    def _tree_states(self, g, p):
        """h of every vertex, written as DyNet's treelstm example does: a vertex skips the products
        with absent inputs (leaves: the word's path only; internal vertices: the children's)."""
        dy, h = self.dy, self.hidden
        hs, cs = [None] * g.num_vertices, [None] * g.num_vertices
        for v in np.argsort(levels(g.children), kind="stable").tolist():
            tok, kids = int(g.tokens[v]), g.children[v]
            pre = [p["b"]]
            if tok >= 0:
                pre += [p["Wx"], p["emb"][tok]]
            if (kids >= 0).any():
                pre += [p["Uh"], dy.concatenate([hs[k] if k >= 0 else dy.zeros(h) for k in kids])]
            gates = dy.affine_transform(pre)            # i, fl, fr, o, u
            sig = dy.logistic(dy.pick_range(gates, 0, 4 * h))
            terms = [dy.cmult(dy.pick_range(sig, 0, h), dy.tanh(dy.pick_range(gates, 4 * h, 5 * h)))]
            terms += [dy.cmult(dy.pick_range(sig, (k + 1) * h, (k + 2) * h), cs[c])
                      for k, c in enumerate(kids.tolist()) if c >= 0]
            c = dy.esum(terms) if len(terms) > 1 else terms[0]
            hs[v], cs[v] = dy.cmult(dy.pick_range(sig, 3 * h, 4 * h), dy.tanh(c)), c
        return hs

    def _exprs(self, trainable: bool):
        return {name: (q if name == "emb" else q.expr(trainable)) for name, q in self.params.items()}

    def train_step(self, lines):
        dy = self.dy
        dy.renew_cg()
        p = self._exprs(True)
        losses, words = [], set()
        for g in _graphs(lines):
            hs = self._tree_states(g, p)
            words.update(int(t) for t in g.tokens if t >= 0)
            losses += [dy.pickneglogsoftmax(dy.affine_transform([p["bout"], p["Wout"], hs[v]]), int(y))
                       for v, y in enumerate(g.labels.tolist()) if y >= 0]
        mean = dy.esum(losses) * (1.0 / len(losses))
        total = mean
        if self.weight_decay:     # L2 on the dense parameters and on the embedding rows looked up
            l2 = [dy.squared_norm(p[name]) for name in self.params if name != "emb"]
            rows = dy.lookup_batch(self.params["emb"], sorted(words))
            l2.append(dy.sum_batches(dy.squared_norm(rows)))
            total = mean + dy.esum(l2) * (0.5 * self.weight_decay)
        total.value()             # forward: autobatching happens here
        value = mean.value()      # the data loss alone, already computed
        total.backward()
        self.trainer.update()
        return float(value)

    def predict_batch(self, lines):
        dy = self.dy
        dy.renew_cg()
        p = self._exprs(False)
        roots = []
        for g in _graphs(lines):
            hs = self._tree_states(g, p)
            roots.append(dy.softmax(dy.affine_transform([p["bout"], p["Wout"], hs[root_of(g)]])))
        return np.asarray(dy.concatenate_cols(roots).npvalue(), dtype=np.float64).reshape(CLASSES, -1).T


TRAINERS = {"cavs": CavsTrainer, "dynet": DynetTrainer, "pytorch": PytorchTrainer}


def make(name: str, **kw) -> Trainer:
    if name not in TRAINERS:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(TRAINERS)}")
    return TRAINERS[name](**kw)
