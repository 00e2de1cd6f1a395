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
Training rule (docs/workloads.md, revised): SGD on the mean of the batch's loss terms (summed softmax
cross-entropy / labelled vertices or predicted tokens), gradients of all parameters together clipped
to a global L2 norm of workloads.CLIP_NORM (5.0), then p -= workloads.LEARNING_RATE (1.0) * g.
step() returns that mean loss.

Training to accuracy (experiments/studies/sst.py) asks for more, of the systems that take it
(`takes_adagrad`: Cavs, DyNet, PyTorch per sample):

    system = SYSTEMS[name]("tree_lstm", ..., embed=300, optimizer=Adagrad(lr=0.05, weight_decay=1e-4))
    system.warm_up(batch)              # first-call costs (compiling), no parameter or optimizer change
    probs = system.predict(batch)      # (samples, classes) softmax probabilities at each sample's root
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cavs.memory import Timings          # the one Timings class: the engine and every system


@dataclass(frozen=True)
class Adagrad:
    """torch.optim.Adagrad's rule, the optimizer of SST training in every system that takes it:

        g <- grad + weight_decay * p;  acc <- acc + g^2;  p <- p - lr * g / (sqrt(acc) + eps)

    accumulators from 0, no gradient clipping, and for an embedding table only on the rows some
    sample of the batch looked up (rows no sample used are untouched: no decay, no accumulator
    change), as PyTorch's sparse embedding gradients give. How each system gets there is in its
    module (DyNet divides by sqrt(acc + eps^2), the same to within float32 rounding)."""
    lr: float
    weight_decay: float = 0.0
    eps: float = 1e-10


def root_of(g) -> int:
    """The root of a sample's graph: the one vertex that is nobody's child."""
    is_child = np.zeros(g.num_vertices, dtype=bool)
    is_child[g.children[g.children >= 0]] = True
    roots = np.flatnonzero(~is_child)
    if len(roots) != 1:
        raise ValueError(f"{g.name}: expected one root, found {len(roots)}")
    return int(roots[0])


class System:
    """Base class: subclasses set `name`, `device`, and implement the four methods below.
    `embed`: the embedding width (None: the workload's); `optimizer`: None for docs/workloads.md's SGD,
    or an Adagrad (systems with `takes_adagrad`)."""
    name = "system"
    # the library its matrix products run in (each row of a sweep records it)
    blas = "?"
    supports_float64 = True
    takes_adagrad = False
    workloads = ("fixed_lstm", "var_lstm", "tree_fc", "tree_lstm")

    def __init__(self, workload: str, *, hidden: int, batch_size: int, mode: str = "train",
                 dtype: str = "float32", threads: int = 1, seed: int = 0, leaves: int = 256,
                 device: str = "cpu", embed: int | None = None, optimizer: Adagrad | None = None,
                 **options):
        if workload not in self.workloads:
            raise NotImplementedError(f"{self.name} does not implement workload {workload!r}")
        if mode not in ("train", "infer"):
            raise ValueError(f"mode must be 'train' or 'infer', got {mode!r}")
        if optimizer is not None and not self.takes_adagrad:
            raise NotImplementedError(f"{self.name} does not implement the Adagrad option")
        self.workload, self.hidden, self.batch_size, self.mode = workload, hidden, batch_size, mode
        self.dtype, self.threads, self.seed, self.leaves, self.device = dtype, threads, seed, leaves, device
        self.embed, self.optimizer = embed, optimizer
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

    def predict(self, batch) -> np.ndarray:
        """(samples, classes) softmax probabilities of the output layer at each sample's root."""
        raise NotImplementedError

    def warm_up(self, batch) -> None:
        """Pays first-call costs (kernel compilation, buffers) untimed, changing no parameter and no
        optimizer state: by default one predict."""
        self.predict(batch)

    def synchronize(self) -> None:
        """Waits for queued device work (GPU systems override this)."""
