"""The Cavs engine behind the baseline interface, so the runner treats it like any other system.

construct_s = reading the raw samples into input graphs + scheduling + message plans;
compute_s   = forward, loss, backward and the SGD update;
memory_s    = the part of compute spent in gather/scatter/pull/push (the engine's own timer).

With the Adagrad option the engine's own optimizer runs it: cavs.optim.Adagrad(lr, weight_decay,
eps) is torch.optim.Adagrad's rule by spec, and updates an embedding only on the rows looked up.
"""
from __future__ import annotations

import time

import numpy as np

import cavs
from cavs import optim, workloads

from .base import System, root_of


class CavsSystem(System):
    name = "cavs"
    takes_adagrad = True

    def __init__(self, workload, *, policy="batched", backend=None, lazy=True, eager=True,
                 fusion=None, streaming=None, share_tokens=True, **kwargs):
        super().__init__(workload, **kwargs)
        self.model = cavs.models.build(workload, hidden=self.hidden, seed=self.seed, dtype=self.dtype,
                                       leaves=self.leaves, embed=self.embed)
        backend = backend or ("cupy" if self.device == "cuda" else "numpy")
        options = dict(lazy=lazy, eager=eager, fusion=fusion, streaming=streaming,   # None: engine default
                       share_tokens=share_tokens)
        if self.optimizer is None:      # docs/workloads.md's rule, from the same constants the other systems read
            rule = optim.SGD(lr=workloads.LEARNING_RATE, clip_norm=workloads.CLIP_NORM)
        else:
            rule = optim.Adagrad(lr=self.optimizer.lr, weight_decay=self.optimizer.weight_decay,
                                 eps=self.optimizer.eps)
        self.engine = cavs.Engine(self.model, backend=backend, policy=policy, threads=self.threads,
                                  optimizer=rule, **options)
        self.timings.memory_s = 0.0
        self.timings.extra.update(backend=backend, policy=policy, **self.engine.options)

    @property
    def blas(self) -> str:
        """The engine's choice per product shape (cavs/blas.py), e.g. 'auto: onednn 40, openblas 35'."""
        return self.engine.backend.blas

    def set_params(self, params):
        for name, value in params.items():
            self.engine.params[name] = value

    def get_params(self):
        return {name: self.engine.params[name].copy() for name in self.engine.params}

    def prepare(self, samples):
        t0 = time.perf_counter()
        batch = self.model.make_batch(samples)
        batch.schedule(self.engine.policy)
        self.timings.construct_s += time.perf_counter() - t0
        return batch

    def step(self, batch) -> float:
        e = self.engine.timings
        before = (e.construct_s, e.compute_s, e.memory_s)
        loss = self.engine.step(batch) if self.mode == "train" else self.engine.infer(batch)
        self.timings.construct_s += e.construct_s - before[0]    # message plans, built on first use
        self.timings.compute_s += e.compute_s - before[1]
        self.timings.memory_s += e.memory_s - before[2]
        self.timings.samples += batch.num_samples
        self.timings.steps += 1
        return loss

    def predict(self, batch):
        # the engine's rows come in each graph's own vertex order
        return np.stack([p[root_of(g)] for g, p in zip(batch.graphs, self.engine.predict(batch))])

    def warm_up(self, batch):
        """Compiles the fused kernels of F and dF: a forward and a backward without an update."""
        self.engine.loss_and_grads(batch)
        self.predict(batch)

    def synchronize(self):
        self.engine.backend.synchronize()
