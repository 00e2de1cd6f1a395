"""The Cavs engine through cavs.torch: the SST Tree-LSTM as a cavs.torch.VertexModule (no built-in
head), with a torch nn.Embedding feeding pull() through `inputs`, a torch softmax head (nn.Linear,
cross-entropy over the labelled vertices) and a torch optimizer: what a PyTorch user of Cavs writes.

From the same initial values (cavs.workloads.init_params; the head's weight is Wout transposed) it
takes the native CavsSystem's steps:
- the Adagrad option: torch.optim.Adagrad(lr, eps), weight decay on the encoder and the head, and
  the embedding updated only on the rows the batch looked up (nn.Embedding(sparse=True): torch's
  sparse Adagrad, which refuses weight_decay, so the L2 term is added to those rows' gradient
  here), as cavs.optim.Adagrad updates an embedding;
- otherwise WORKLOADS.md's rule: SGD lr 1.0 after clipping every gradient together to a global norm
  of 5.0 (the sparse embedding gradient counted once per row, as clip_grad_norm_ cannot take it).
The engine's own table (the model's embedding=(V, E), which gives pull() its width) is frozen and
never read: `inputs` replace it. CPU only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import cavs
import cavs.torch
from cavs import workloads
from cavs.models import tree_lstm

from .base import System


@dataclass
class TorchBatch:
    batch: cavs.Batch
    tokens: torch.Tensor      # the token of each vertex that has one ...
    has_token: torch.Tensor   # ... and which vertices those are
    labelled: torch.Tensor    # the vertices with a label, and their labels
    labels: torch.Tensor
    roots: torch.Tensor

    @property
    def num_samples(self) -> int:
        return self.batch.num_samples


class CavsTorchSystem(System):
    name = "cavs-torch"
    takes_adagrad = True
    workloads = ("tree_lstm",)

    def __init__(self, workload, **kwargs):
        super().__init__(workload, **kwargs)
        if self.device != "cpu":
            raise NotImplementedError(f"{self.name} runs on the CPU only")
        torch.set_num_threads(self.threads)
        s = workloads.sizes(workload, self.hidden, self.leaves, self.embed)
        h, dtype = self.hidden, getattr(torch, self.dtype)
        model = cavs.Model(tree_lstm.cell, {"Wx": (s.embed, 5 * h), "Uh": (2 * h, 5 * h), "b": (5 * h,)},
                           arity=2, state=2 * h, embedding=(s.vocab, s.embed), classes=None, seed=self.seed,
                           dtype=self.dtype, name="tree_lstm")
        self.encoder = cavs.torch.VertexModule(model, threads=self.threads, frozen=("emb",))
        self.embedding = torch.nn.Embedding(s.vocab, s.embed, sparse=True, dtype=dtype)
        self.head = torch.nn.Linear(h, s.classes, dtype=dtype)
        self.timings.extra.update(backend=self.encoder.engine.backend.name, threads=self.threads)
        self.set_params(workloads.init_params(workload, h, self.seed, self.dtype, self.leaves, self.embed))

    @property
    def blas(self) -> str:
        return f"{self.encoder.engine.backend.blas}; head: torch"

    def _dense(self) -> list:
        return [p for p in [*self.encoder.parameters(), *self.head.parameters()] if p.requires_grad]

    def set_params(self, params):
        """The parameters, and a fresh optimizer state for them."""
        with torch.no_grad():
            for name in ("Wx", "Uh", "b"):
                getattr(self.encoder, name).copy_(torch.as_tensor(params[name]))
            self.embedding.weight.copy_(torch.as_tensor(params["emb"]))
            self.head.weight.copy_(torch.as_tensor(params["Wout"]).T)
            self.head.bias.copy_(torch.as_tensor(params["bout"]))
        rule = self.optimizer
        if rule is None:
            self.opt = torch.optim.SGD([*self._dense(), self.embedding.weight], lr=workloads.LEARNING_RATE)
        else:
            self.opt = torch.optim.Adagrad([{"params": self._dense(), "weight_decay": rule.weight_decay},
                                            {"params": [self.embedding.weight], "weight_decay": 0.0}],
                                           lr=rule.lr, eps=rule.eps, initial_accumulator_value=0.0, lr_decay=0.0)

    def get_params(self):
        out = {name: getattr(self.encoder, name).detach().numpy().copy() for name in ("Wx", "Uh", "b")}
        return {"emb": self.embedding.weight.detach().numpy().copy(), **out,
                "Wout": self.head.weight.detach().numpy().T.copy(), "bout": self.head.bias.detach().numpy().copy()}

    def prepare(self, samples):
        with self.timings.timing("construct_s"):
            graphs = workloads.to_graphs(self.workload, samples)
            labels = torch.as_tensor(np.concatenate([g.labels for g in graphs]))    # rows in vertex order
            # the labels are the torch loss's: a model without a head takes graphs without them
            batch = self.encoder.model.make_batch([cavs.Graph(g.children, g.tokens, np.full_like(g.labels, -1), g.name)
                                                   for g in graphs])
            batch.schedule(self.encoder.engine.policy)
            tokens = torch.as_tensor(batch.forest.tokens)
            has, labelled = tokens >= 0, torch.nonzero(labels >= 0).squeeze(1)
            prepared = TorchBatch(batch, tokens[has], has, labelled, labels[labelled], torch.as_tensor(batch.roots))
        return prepared

    def _outputs(self, b: TorchBatch) -> torch.Tensor:
        """What every vertex pushed, its input the torch embedding of its token (zeros without one)."""
        x = self.embedding.weight.new_zeros(b.batch.num_vertices, self.embedding.embedding_dim)
        x[b.has_token] = self.embedding(b.tokens)
        return self.encoder(b.batch, inputs=x)

    def _loss(self, b: TorchBatch) -> torch.Tensor:
        return F.cross_entropy(self.head(self._outputs(b)[b.labelled]), b.labels)

    def step(self, batch) -> float:
        with self.timings.timing("compute_s"):
            if self.mode == "train":
                self.opt.zero_grad(set_to_none=True)
                loss = self._loss(batch)
                loss.backward()
                self._update()
            else:
                with torch.no_grad():
                    loss = self._loss(batch)
            value = float(loss.detach())
        self.timings.samples += batch.num_samples
        self.timings.steps += 1
        return value

    def _update(self) -> None:
        emb = self.embedding.weight
        rule = self.optimizer
        if rule is None:
            clip([*self._dense(), emb], workloads.CLIP_NORM)
        elif rule.weight_decay:
            g = emb.grad.coalesce()
            rows = g.indices()[0]
            emb.grad = torch.sparse_coo_tensor(g.indices(), g.values() + rule.weight_decay * emb.detach()[rows],
                                               g.shape, is_coalesced=True, check_invariants=False)
        self.opt.step()

    def predict(self, batch) -> np.ndarray:
        self.encoder.eval()
        with torch.no_grad():
            probs = torch.softmax(self.head(self._outputs(batch)[batch.roots]), dim=1).numpy()
        self.encoder.train()
        return probs

    def warm_up(self, batch) -> None:
        """A forward and backward (the engine's kernels), no update; then a predict."""
        self._loss(batch).backward()
        self.opt.zero_grad(set_to_none=True)
        self.predict(batch)


def clip(params: list, max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_ over dense and sparse gradients together (it takes no sparse
    one): each sparse row is counted once, summed over the lookups of it."""
    grads = [p.grad.coalesce() if p.grad.is_sparse else p.grad for p in params if p.grad is not None]
    norm = float(torch.stack([torch.linalg.vector_norm(g.values() if g.is_sparse else g) for g in grads]).norm())
    coef = max_norm / (norm + 1e-6)
    if coef < 1:
        for p, g in zip([p for p in params if p.grad is not None], grads):
            p.grad = g * coef
