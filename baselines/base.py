"""The one interface every system of the evaluation implements (the Cavs engine included).

The sweep runner only ever calls this interface, so it never special-cases a system:

    system = SYSTEMS[name](workload, hidden=..., batch_size=..., mode="train", dtype="float32",
                           threads=1, seed=0, leaves=256, device="cpu")
    system.set_params(cavs.workloads.init_params(...))   # optional: the constructor already does this
    batch = system.prepare(samples)    # graph construction / preprocessing that can be done ahead
    loss = system.step(batch)          # train: forward, backward, SGD update; infer: forward + loss
    system.timings                     # Timings accumulated over prepare() and step() calls

Every system builds its initial weights with `cavs.workloads.init_params(workload, hidden, seed,
dtype, leaves)` and its graphs with `cavs.workloads.to_graph`, so all start identical.
Training rule (WORKLOADS.md, revised): SGD on the mean of the batch's loss terms (summed softmax
cross-entropy / labelled vertices or predicted tokens), gradients of all parameters together clipped
to a global L2 norm of workloads.CLIP_NORM (5.0), then p -= workloads.LEARNING_RATE (1.0) * g.
step() returns that mean loss.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Timings:
    """Seconds spent, split the way the paper splits them; None where a system cannot measure it."""
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


class System:
    """Base class: subclasses set `name`, `device`, and implement the four methods below."""
    name = "system"
    supports_float64 = True
    workloads = ("fixed_lstm", "var_lstm", "tree_fc", "tree_lstm")

    def __init__(self, workload: str, *, hidden: int, batch_size: int, mode: str = "train",
                 dtype: str = "float32", threads: int = 1, seed: int = 0, leaves: int = 256,
                 device: str = "cpu", **options):
        if workload not in self.workloads:
            raise NotImplementedError(f"{self.name} does not implement workload {workload!r}")
        if mode not in ("train", "infer"):
            raise ValueError(f"mode must be 'train' or 'infer', got {mode!r}")
        self.workload, self.hidden, self.batch_size, self.mode = workload, hidden, batch_size, mode
        self.dtype, self.threads, self.seed, self.leaves, self.device = dtype, threads, seed, leaves, device
        self.options = options
        self.timings = Timings()

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def get_params(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def prepare(self, samples: list):
        raise NotImplementedError

    def step(self, batch) -> float:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Waits for queued device work (GPU systems override this)."""
