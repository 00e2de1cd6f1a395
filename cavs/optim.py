"""Optimizers: SGD, Adagrad and Adam, as `torch.optim` defines them, on the engine's backend.

    engine = cavs.Engine(model, optimizer=cavs.optim.Adagrad(lr=0.05, weight_decay=1e-4))
    engine.step(batch)

Each takes `lr`, an optional L2 `weight_decay` (added to the gradient, `g + wd * p`, as
torch.optim does) and an optional `clip_norm`: all gradients together are first scaled to a global
L2 norm of at most `clip_norm`, exactly as `torch.nn.utils.clip_grad_norm_` (coefficient
clip_norm / (norm + 1e-6), applied when below 1). Parameters given to the engine as `frozen=` (the
embedding included) neither move nor count in that norm, as `clip_grad_norm_` over the trainable ones.

The embedding is updated sparsely: only the rows some vertex of the batch read change, and their
gradient is the sum over the vertices that read them (the clipping norm counts each such row
once, as the dense gradient would). Rows no vertex used are left alone: no weight decay and no
optimizer-state change, as PyTorch does with a sparse embedding (Adagrad's accumulators, Adam's
moments with the global step count for the bias correction, like `torch.optim.SparseAdam`).
So with weight decay, an embedding row decays only in the steps that use it.

The state (Adagrad's sums, Adam's moments) lives on the engine's backend, in its dtype, and is
saved and loaded with the engine (`state_dict`).
"""
from __future__ import annotations

import math
import numbers

CLIP_EPS = 1e-6        # torch.nn.utils.clip_grad_norm_'s


def _finite_number(x) -> bool:
    """A real, finite number (not a bool, a str or NaN), as every hyperparameter must be."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


class Optimizer:
    """Base class: `update(params, grads, rows, row_grads)` applies one step in place."""
    state_names: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()

    def __init__(self, lr: float, weight_decay: float = 0.0, clip_norm: float | None = None):
        if not _finite_number(lr) or lr <= 0:
            raise ValueError(f"lr must be a positive number, got {lr!r}")
        if not _finite_number(weight_decay) or weight_decay < 0:
            raise ValueError(f"weight_decay must be a number >= 0, got {weight_decay!r}")
        if clip_norm is not None and (not _finite_number(clip_norm) or clip_norm <= 0):
            raise ValueError(f"clip_norm must be a positive number or None, got {clip_norm!r}")
        self.lr, self.weight_decay, self.clip_norm = lr, weight_decay, clip_norm
        self.steps = 0
        self.state: dict[str, dict] = {}     # state name -> {param name: array}

    def __repr__(self):
        return (f"{type(self).__name__}(lr={self.lr}, weight_decay={self.weight_decay}, "
                f"clip_norm={self.clip_norm})")

    def bind(self, xp, params: dict) -> None:
        """Creates the state (zeros like each parameter) on the engine's backend."""
        for s in self.state_names:
            self.state.setdefault(s, {k: xp.zeros_like(p) for k, p in params.items()})

    def clip_coefficient(self, xp, grads: dict, row_grads, squares: float | None = None) -> float:
        """`squares`: the gradients' sum of squares where the caller has it already."""
        if self.clip_norm is None:
            return 1.0
        if squares is None:
            squares = sum(float(xp.vdot(g.ravel(), g.ravel())) for g in grads.values())
            if row_grads is not None:
                squares += float(xp.vdot(row_grads.ravel(), row_grads.ravel()))
        return min(1.0, self.clip_norm / (math.sqrt(squares) + CLIP_EPS))

    def update(self, be, params: dict, grads: dict, sparse: str | None, rows, row_grads,
               squares: float | None = None) -> None:
        """params[k] -= ... for every dense gradient grads[k], and for the sparse parameter
        `sparse` (the embedding) on `rows` with `row_grads` (one summed row per distinct row).
        `squares`: the sum of squares of those gradients, if known (for clipping). Gradients
        may be overwritten."""
        xp = be.xp
        self.steps += 1
        coef = self.clip_coefficient(xp, grads, row_grads, squares)
        for name, g in grads.items():
            self._dense(xp, name, params[name], g, coef)
        if sparse is not None and len(rows):
            self._rows(be, sparse, params[sparse], rows, row_grads, coef)

    def _decayed(self, g, p, coef):
        """The gradient after clipping and L2 weight decay (torch: clip first, then decay)."""
        if coef != 1.0:
            g *= coef
        if self.weight_decay:
            g = g + self.weight_decay * p
        return g

    def config(self) -> dict:
        """The type and constructor arguments (saved with the engine)."""
        args = {"lr": self.lr, "weight_decay": self.weight_decay, "clip_norm": self.clip_norm}
        args.update({k: getattr(self, k) for k in self.extra_args})
        return {"type": type(self).__name__, "args": args}

    def state_dict(self, to_numpy) -> dict:
        return {"steps": self.steps,
                **{f"{s}/{k}": to_numpy(v) for s, per in self.state.items() for k, v in per.items()}}

    def load_state_dict(self, be, saved: dict, dtype) -> None:
        self.steps = int(saved["steps"])
        for key, value in saved.items():
            if "/" in key:
                s, k = key.split("/", 1)
                self.state.setdefault(s, {})[k] = be.asarray(value, dtype=dtype)


class SGD(Optimizer):
    """p -= lr * g (docs/workloads.md's default: lr 1.0, clip_norm 5.0, on the batch's mean loss)."""

    def _dense(self, xp, name, p, g, coef):
        if self.weight_decay:
            g = self._decayed(g, p, coef)
            coef = 1.0
        xp.multiply(g, -self.lr * coef, out=g)       # in place: no temporary the size of p
        p += g

    def _rows(self, be, name, p, rows, g, coef):
        if self.weight_decay:
            g = self._decayed(g, p[rows], coef)
            coef = 1.0
        be.add_rows(p, rows, g, unique=True, scale=-self.lr * coef)


class Adagrad(Optimizer):
    """torch.optim.Adagrad: sum += g^2; p -= lr * g / (sqrt(sum) + eps)."""
    state_names = ("sum",)
    extra_args = ("eps",)

    def __init__(self, lr: float = 0.01, weight_decay: float = 0.0, clip_norm: float | None = None,
                 eps: float = 1e-10):
        super().__init__(lr, weight_decay, clip_norm)
        if not _finite_number(eps) or eps < 0:
            raise ValueError(f"eps must be a number >= 0, got {eps!r}")
        self.eps = eps

    def _dense(self, xp, name, p, g, coef):
        g = self._decayed(g, p, coef)
        acc = self.state["sum"][name]
        acc += g * g
        p -= self.lr * g / (xp.sqrt(acc) + self.eps)

    def _rows(self, be, name, p, rows, g, coef):
        xp = be.xp
        g = self._decayed(g, p[rows], coef)
        acc = self.state["sum"][name]
        a = acc[rows] + g * g
        acc[rows] = a
        p[rows] -= self.lr * g / (xp.sqrt(a) + self.eps)


class Adam(Optimizer):
    """torch.optim.Adam (L2 weight decay added to the gradient, not AdamW)."""
    state_names = ("m", "v")
    extra_args = ("betas", "eps")

    def __init__(self, lr: float = 0.001, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, clip_norm: float | None = None):
        super().__init__(lr, weight_decay, clip_norm)
        if not _finite_number(eps) or eps < 0:
            raise ValueError(f"eps must be a number >= 0, got {eps!r}")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2 or \
                not all(_finite_number(b) and 0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1) (as torch.optim.Adam's), got {betas!r}")
        self.betas, self.eps = tuple(betas), eps

    def _moments(self, xp, g, m, v):
        b1, b2 = self.betas
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * g * g
        c1, c2 = 1 - b1 ** self.steps, 1 - b2 ** self.steps
        return (self.lr / c1) * m / (xp.sqrt(v) / math.sqrt(c2) + self.eps)

    def _dense(self, xp, name, p, g, coef):
        g = self._decayed(g, p, coef)
        p -= self._moments(xp, g, self.state["m"][name], self.state["v"][name])

    def _rows(self, be, name, p, rows, g, coef):
        g = self._decayed(g, p[rows], coef)
        m, v = self.state["m"][name][rows], self.state["v"][name][rows]
        p[rows] -= self._moments(be.xp, g, m, v)
        self.state["m"][name][rows] = m
        self.state["v"][name][rows] = v


OPTIMIZERS = {"SGD": SGD, "Adagrad": Adagrad, "Adam": Adam}


def from_config(config: dict) -> Optimizer:
    if config.get("type") not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {config.get('type')!r}; known: {', '.join(OPTIMIZERS)}")
    args = dict(config["args"])
    if "betas" in args:
        args["betas"] = tuple(args["betas"])
    return OPTIMIZERS[config["type"]](**args)
