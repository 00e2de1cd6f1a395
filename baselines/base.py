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

import numpy as np

from cavs.memory import Timings          # the one Timings class: the engine and every system


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
