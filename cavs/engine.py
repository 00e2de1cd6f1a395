"""The engine: batched training and inference of one model's vertex function over input graphs.

    engine = cavs.Engine(model, optimizer=cavs.optim.Adagrad(lr=0.05))
    loss = engine.step(batch)                 # forward, loss, backward, update
    loss, grads = engine.loss_and_grads(batch)
    probs = engine.predict(batch)             # per graph, the head's probabilities per vertex

The stages, one file each: lowering.py compiles F and dF once into storage and per-op closures;
per batch, the schedule (scheduler.py), the message plans (memory.py) and what each op must
compute on each task (support.py) are derived once and cached on the batch, planning.py turns them
into closures per task and runs them (eager phase, task loop, lazy phase). The loss sits outside F
(loss.py), the update in the optimizer (optim.py). This file holds the public API, then one pass:
prepare, forward, loss, backward.
"""
from __future__ import annotations

import json
import time
import warnings
import zipfile
from collections.abc import MutableMapping

import numpy as np

from . import blas as cpu_blas
from . import fusion as kernels
from . import optim, planning, tokens
from .backend import get_backend
from .loss import softmax, softmax_cross_entropy, warm_up as loss_warm_up
from .lowering import Lowered
from .memory import Counters, EdgePlan, LossPlan, MessagePlans, PullPlan, Timings
from .graphs import whole
from .model import EMBEDDING, HEAD, Batch, Model, check_finite, check_whole
from .scheduler import POLICIES
from .support import SKIP, actions


class NonFiniteError(ArithmeticError):
    """A step whose loss or gradients are not finite: the parameters were left as they were."""


class Engine:
    """Batched training and inference of one model's vertex function over input graphs."""

    def __init__(self, model, backend: str | None = None, policy: str = "batched", *,
                 optimizer: "optim.Optimizer | None" = None,
                 lazy: bool = True, eager: bool = True, fusion: bool | None = None,
                 streaming: bool | None = None, share_tokens: bool = True,
                 threads: int | None = None, blas: str | None = None,
                 seed: int | None = None, frozen=(), on_nonfinite: str = "raise"):
        if not isinstance(model, Model):
            raise TypeError(f"the engine takes a cavs.Model (cavs.Model(cell, params, state=..., ...)), got "
                            f"{type(model).__name__}")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")
        for name, value, may_be_none in (("lazy", lazy, False), ("eager", eager, False), ("fusion", fusion, True),
                                         ("streaming", streaming, True), ("share_tokens", share_tokens, False)):
            if not (isinstance(value, (bool, np.bool_)) or (may_be_none and value is None)):
                raise TypeError(f"{name} must be True or False{' (or None: the default)' if may_be_none else ''}, "
                                f"got {value!r}")
        if seed is not None:                  # None: the model's
            check_whole("seed", seed, least=0)
        if isinstance(frozen, str):      # one name, not its letters
            frozen = (frozen,)
        if threads is not None and (not whole(threads) or threads < 0):
            raise ValueError(f"threads must be a positive integer (or None or 0 to leave the process's "
                             f"setting as it is), got {threads!r}")
        if on_nonfinite not in ("raise", "skip"):
            raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")
        unknown = sorted(set(frozen) - set(model.param_shapes))
        if unknown:
            raise ValueError(f"frozen names {unknown}, not parameters of {model.describe()}: "
                             f"{', '.join(model.param_shapes)}")
        self.frozen, self.on_nonfinite, self.skipped_steps = frozenset(frozen), on_nonfinite, 0
        self.model, self.policy = model, policy
        if optimizer is not None and not isinstance(optimizer, optim.Optimizer):
            kind = type(optimizer)
            got = (f"the class {optimizer.__name__} (give an instance: {optimizer.__name__}(lr=...))"
                   if isinstance(optimizer, type) else kind.__name__ if kind.__module__ == "builtins"
                   else f"{kind.__module__}.{kind.__qualname__}")
            raise TypeError(f"optimizer must be a cavs optimizer (cavs.optim.SGD(...), Adagrad(...), Adam(...)), got "
                            f"{got}; a torch.optim optimizer trains a cavs.torch.VertexModule")
        # docs/workloads.md's rule by default: SGD, lr 1.0, gradients clipped to a global norm of 5.0
        self.optimizer = optimizer if optimizer is not None else optim.SGD(lr=1.0, clip_norm=5.0)
        self.backend = get_backend(backend)
        # defaults = the fastest combination measured (docs/design.md): fusion everywhere (on the CPU
        # the generated Numba kernels beat NumPy's per-op loops 3-4x on the cell's elementwise work);
        # streaming only on the GPU (on the CPU a second thread's contention outweighs the overlap)
        on_gpu = self.backend.name == "cupy"
        self.options = {"lazy": lazy, "eager": eager,
                        "fusion": True if fusion is None else fusion,
                        "streaming": on_gpu if streaming is None else streaming,
                        # products of a word's embedding once per distinct word of a batch (tokens.py)
                        "share_tokens": share_tokens}
        self.xp = self.backend.xp
        if threads:      # BLAS threads for this process (the benchmarks pin 1)
            from threadpoolctl import threadpool_limits
            self._threads = threadpool_limits(threads)
            self.backend.set_threads(threads)
        self.dtype = np.dtype(model.dtype)
        self._params = {k: self.backend.parameter(v, dtype=self.dtype) for k, v in model.init_params().items()}
        self.params = ParamView(self)
        # gradient accumulators, zeroed in place per batch (reduce steps hold references to them);
        # the embedding's gradient is per row read (sparse), see _backward
        self._grads = {k: self.xp.zeros_like(v) for k, v in self._params.items() if k != EMBEDDING}
        self.optimizer.bind(self.xp, self._params)
        if self.backend.name == "numpy":     # the fastest library per product shape (blas.py), measured once
            # streaming: two threads each multiply (the loop; the eager and lazy phases), one thread apiece
            per_stream = 1 if self.options["streaming"] else threads
            if per_stream == 1 and threads and threads > 1:
                cpu_blas.set_pool_threads(None, 1)
            self.backend.use_gemm(cpu_blas.choose(self._gemm_keys(model), self.dtype, per_stream, blas,
                                                  self._gemm_uses(model)))
        elif blas not in (None, "auto"):
            raise ValueError(f"blas={blas!r} chooses among CPU libraries; the {self.backend.name} backend "
                             f"multiplies with {self.backend.blas}")
        # dropout masks: drawn per training pass from this generator (seeded: runs are reproducible)
        self._rng = np.random.default_rng(model.seed if seed is None else seed)
        self.counters = Counters()
        self.timings = Timings(memory_s=0.0)
        self._low = Lowered(model.F, model.dF, self.backend, self.dtype, self._grads, self.options,
                            self.counters, self.timings)
        self.forward_phases, self.backward_phases = self._low.forward_phases, self._low.backward_phases
        self.phase_of = self._low.phase_of
        self._action_cache = {}           # task signature -> actions (support.actions), for this F and dF
        if self.backend.name == "numpy":
            # Numba's start-up and the kernels (from the on-disk cache, or compiled) now, at
            # construction, not in the first step
            if self.options["fusion"]:
                kernels.warm_up(self._low.fused_groups(), self.dtype.name, cached_only=True)
            if self.dtype.name in ("float32", "float64"):
                loss_warm_up(self.dtype.name)

    # ------------------------------------------------------------ public API

    def loss_and_grads(self, batch):
        """(loss, {parameter name: gradient as a numpy array}) for one batch."""
        self._needs_head("loss_and_grads")
        loss = self._pass(batch)
        grads = {n: np.array(self.backend.to_numpy(g)) for n, g in self._grads.items()}
        if EMBEDDING in self._params:
            emb = np.zeros(self._params[EMBEDDING].shape, dtype=self.dtype)
            rows, g = self._row_grads()
            if rows is not None:
                emb[self.backend.to_numpy(rows)] = self.backend.to_numpy(g)
            grads[EMBEDDING] = emb
        return loss, grads

    def step(self, batch) -> float:
        """One update with the engine's optimizer; returns the loss before the update. A loss or a
        gradient that is not finite (overflowed logits, a diverged model) updates nothing: it raises
        NonFiniteError, or with on_nonfinite="skip" the step is skipped (counted in skipped_steps)."""
        self._needs_head("step")
        loss = self._pass(batch)
        t0 = time.perf_counter()
        rows, row_grads = self._row_grads()
        squares = self._squares(row_grads)
        if not self._finite(loss, squares, row_grads):
            self.skipped_steps += 1
            if self.on_nonfinite == "raise":
                raise NonFiniteError(self._nonfinite_message(batch, loss, row_grads))
            return loss
        grads = {k: g for k, g in self._grads.items() if k not in self.frozen}
        sparse = EMBEDDING if rows is not None and EMBEDDING not in self.frozen else None
        # clipping's norm over the parameters updated, as clip_grad_norm_ over the trainable ones
        updated = sum(v for k, v in squares.items() if k not in self.frozen)
        self.optimizer.update(self.backend, self._params, grads, sparse, rows, row_grads, updated)
        self.backend.synchronize()
        self.timings.compute_s += time.perf_counter() - t0
        return loss

    def infer(self, batch) -> float:
        """Forward and loss only (dropout inactive)."""
        self._needs_head("infer")
        return self._pass(batch, train=False)

    def forward(self, batch, inputs=None, train: bool = True):
        """What every vertex pushed: a (batch.num_vertices, push width) array, rows in the batch's
        vertex order (batch.graph_slices per graph), on the engine's backend. `inputs`, a
        (batch.num_vertices, D) array (NumPy, CuPy or a torch tensor), replaces the embedding or
        the features for this call: every vertex pulls its row. With `train`, dropout is active.
        The built-in head is not applied: this is the boundary to a head and loss of your own."""
        t0 = time.perf_counter()
        self._prepare(batch, mode="boundary", train=train, inputs=inputs)
        self.counters.reset()
        self._forward(want_grad=False, predict=True)
        low, n = self._low, self._sched.num_rows
        out = self.xp.empty((n, low.pushed.shape[0]), dtype=self.dtype)
        out[self.backend.index(self._sched.order)] = low.arrays[low.slot[low.pushed]][:n]
        self.backend.synchronize()
        self.timings.compute_s += time.perf_counter() - t0
        self._forwarded = batch
        return out

    def backward(self, d_out, sparse: bool = False) -> dict:
        """The gradients of the last forward's outputs: `d_out` (batch.num_vertices, push width),
        rows as forward's. Returns {parameter name: gradient} on the engine's backend (the head's
        parameters, if any, are not in it), plus "inputs" (rows as forward's) when forward was
        given inputs; an embedding's gradient is dense, or with `sparse` a pair (rows, values):
        the distinct rows read, sorted, and each one's summed gradient."""
        if getattr(self, "_forwarded", None) is None:
            raise RuntimeError("engine.backward needs a forward first (engine.forward(batch, ...))")
        t0 = time.perf_counter()
        low, A, n = self._low, self._low.arrays, self._sched.num_rows
        d_out = self._rows_in(d_out, low.pushed.shape[0], "d_out")
        for g in self._grads.values():
            g.fill(0)
        A[low.slot[low.dpush]][:n] = d_out[self.backend.index(self._sched.order)]
        self._backward()
        grads = {k: g for k, g in self._grads.items() if k not in HEAD}
        if self._inputs is not None:
            d_in = self.xp.zeros((n, self._pull_width), dtype=self.dtype)
            if low.dpull is not None:
                d_in[self.backend.index(self._sched.order)] = A[low.slot[low.dpull]][:n]
            grads["inputs"] = d_in
        elif EMBEDDING in self._params:
            rows, g = self._row_grads()
            if sparse:
                grads[EMBEDDING] = (rows, g) if rows is not None else \
                    (self.backend.index(np.zeros(0, dtype=np.int64)),
                     self.xp.zeros((0, self._params[EMBEDDING].shape[1]), dtype=self.dtype))
            else:
                emb = self.xp.zeros_like(self._params[EMBEDDING])
                if rows is not None:
                    emb[rows] = g
                grads[EMBEDDING] = emb
        self.backend.synchronize()
        self.timings.compute_s += time.perf_counter() - t0
        self._forwarded = None
        return grads

    def predict(self, batch) -> list:
        """Per graph of the batch, a (num_vertices, classes) array of softmax probabilities of
        the head on what each vertex pushed, rows in the graph's own vertex order (dropout
        inactive)."""
        self._needs_head("predict")
        self._prepare(batch, mode="predict")
        self.counters.reset()
        t0 = time.perf_counter()
        self._forward(want_grad=False, predict=True)
        low, n = self._low, self._sched.num_rows
        probs = softmax(self.backend, low.arrays[low.slot[low.pushed]][:n],
                        self._params["Wout"], self._params["bout"])
        probs = self.backend.to_numpy(probs)
        self.timings.compute_s += time.perf_counter() - t0
        by_vertex = np.empty_like(probs)
        by_vertex[self._sched.order] = probs
        offsets = batch.forest.offsets
        return [by_vertex[offsets[i]:offsets[i + 1]] for i in range(batch.num_samples)]

    def dropout_masks(self) -> dict:
        """{dropout node id: the mask of the last pass, rows in the batch's vertex (or edge)
        order as numpy arrays}: 0 where a feature was dropped, 1 / (1 - rate) where kept."""
        low = self._low
        out = {}
        for n in low.sources:
            if n.op == "dropout_mask":
                rows = self._sched.num_edges if n.on_edges else self._sched.num_rows
                values = self.backend.to_numpy(low.arrays[low.slot[n]][:rows])
                out[n.id] = values if n.on_edges else values[np.argsort(self._sched.order)]
        return out

    def save(self, path) -> None:
        """Parameters, the optimizer (its type and settings) and its state in one .npz file."""
        to_np = self.backend.to_numpy
        with open(path, "wb") as f:      # at `path` itself (np.savez would add .npz to a bare name, and load miss it)
            np.savez(f, **{f"param/{k}": to_np(v) for k, v in self._params.items()},
                     **{f"optim/{k}": v for k, v in self.optimizer.state_dict(to_np).items()},
                     optimizer=np.array(json.dumps(self.optimizer.config())))

    @classmethod
    def load(cls, path, model, **engine_options) -> "Engine":
        """An engine for `model` that continues where the saved one stopped: its parameters, and
        its optimizer rebuilt from the saved type and settings with the saved state (pass
        `optimizer=` to use another; its state is then loaded only if it is of the saved type)."""
        try:
            with np.load(path, allow_pickle=False) as f:
                saved = {k: f[k] for k in f.files}
            config = json.loads(str(saved.pop("optimizer")))
        except FileNotFoundError:
            raise
        except (ValueError, KeyError, OSError, zipfile.BadZipFile) as e:
            raise ValueError(f"{path}: not a file written by Engine.save ({type(e).__name__}: {e})") from None
        if engine_options.get("optimizer") is None:
            engine_options["optimizer"] = optim.from_config(config)
        engine = cls(model, **engine_options)
        params = {k[len("param/"):]: v for k, v in saved.items() if k.startswith("param/")}
        if set(params) != set(engine._params):
            raise ValueError(f"{path}: holds parameters {sorted(params)}, the model has {sorted(engine._params)}")
        for name, value in params.items():
            try:
                engine.params[name] = value
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from None
        if type(engine.optimizer).__name__ == config["type"]:
            engine.optimizer.load_state_dict(engine.backend, {k[len("optim/"):]: v for k, v in saved.items()
                                                              if k.startswith("optim/")}, engine.dtype)
        return engine

    @staticmethod
    def _gemm_keys(model) -> list[tuple]:
        """The products this model's tasks and head run, as blas keys over every row class:
        x W and dy W^T per matmul, x^T dy per parameter gradient."""
        shapes = set()
        for n in model.F.nodes + model.dF.nodes:
            if n.op == "matmul":
                shapes.add(("nn", *n.inputs[1].shape))
            elif n.op == "matmul_t":
                k, m = n.inputs[1].shape
                shapes.add(("nt", m, k))
            elif n.op == "param_grad":
                shapes.add(("tn", *n.attrs["shape"]))
        if model.has_head:
            h, c = model.param_shapes["Wout"]
            shapes |= {("nn", h, c), ("nt", c, h), ("tn", h, c)}
        return [(layout, rows, inner, outer) for layout, inner, outer in shapes for rows in cpu_blas.ROW_CLASSES]

    def _gemm_uses(self, model) -> dict:
        """{(layout, inner, outer): products per pass}: one for a product outside the task loop (an
        eager or lazy phase, the head), blas.LOOP_USES (the default) for the loop's."""
        from .analysis import phases
        fwd = phases(model.F.nodes, {n for n in model.F.nodes if n.op in ("gather", "child_state")}, {model.F.scatter})
        dstate = next(n for n in model.dF.nodes if n.op == "gather_grad_state")
        bwd = phases(model.dF.nodes, {dstate}, {n for n in model.dF.nodes
                                                if n.op in ("scatter_grad_child", "child_state_grad")})
        where = {**fwd, **bwd}
        out = {}
        for n in model.F.nodes + model.dF.nodes:
            if n.op in ("matmul", "matmul_t") and where.get(n) != "loop":
                k, m = n.inputs[1].shape
                out[("nn", k, m) if n.op == "matmul" else ("nt", m, k)] = 1
            elif n.op == "param_grad":
                out[("tn", *n.attrs["shape"])] = 1
        if model.has_head:
            h, c = model.param_shapes["Wout"]
            out.update({("nn", h, c): 1, ("nt", c, h): 1, ("tn", h, c): 1})
        return out

    # ------------------------------------------------------------ one pass

    def _pass(self, batch, train: bool = True) -> float:
        self._prepare(batch, train=train)
        if self.model.has_head and not batch.cached(("labelled",), lambda: bool((batch.forest.labels >= 0).any())):
            warnings.warn("no vertex of this batch has a label (all -1): its loss is 0 and a training step "
                          "changes nothing; give the graphs labels=", stacklevel=3)
        self.counters.reset()
        t0 = time.perf_counter()
        if train:
            for g in self._grads.values():
                g.fill(0)
        loss = self._forward(want_grad=train)
        if train:
            self._backward()
        self.backend.synchronize()
        self.timings.compute_s += time.perf_counter() - t0
        return loss

    def _prepare(self, batch, mode: str = "train", train: bool = False, inputs=None):
        """This batch's schedule and plans (cached on the batch), its buffers bound, the sources
        filled. `mode` "train": the loss reads the labelled vertices; "predict": every vertex's
        output is read; "boundary" (forward/backward): every vertex's output is read and may get
        a gradient. `inputs` replace the pull table for this pass."""
        t0 = time.perf_counter()
        self._check_batch(batch)
        self._forwarded = None               # this pass overwrites the buffers a pending backward reads
        self.backend.new_pass()             # parameters may have changed: packed weights are stale
        if self.backend.name == "numpy":
            self.backend.flush_denormals()   # this thread may not be the one that built the engine
        self._inputs = None if inputs is None else self._rows_in(inputs, None, "inputs", batch)
        pull_all = self._inputs is not None
        be, key = self.backend.name, (self.policy, id(self.model), mode, pull_all)
        self._sched = sched = batch.schedule(self.policy)
        low = self._low
        act = batch.cached(("actions", *key), lambda: actions(self.model.F, self.model.dF, sched, mode, pull_all,
                                                              cache=self._action_cache))
        low.batch = planning.BatchPlans(
            sched, batch.cached(("plans", self.policy, be), lambda: MessagePlans(sched, self.backend))
            if self.model.F.uses_slots else None,
            batch.cached(("edges", self.policy, be), lambda: EdgePlan(sched, self.backend))
            if low.uses_edges else None, act)
        if self.model.has_head:
            self._loss_plan = batch.cached(("loss", self.policy, be), lambda: LossPlan(sched, self.backend))
        pull_read = np.logical_or.reduce([act[p] != SKIP for p in low.pulls]) \
            if low.pulls else np.zeros(sched.num_tasks, dtype=bool)
        self._pull_plan = batch.cached(("pull", be, *key), lambda: PullPlan(sched, self.backend, pull_read, pull_all))
        if pull_all:                     # every vertex pulls its row of the caller's inputs
            self._pull_table = self._inputs
        elif self.model.uses_features:   # the batch's features are its pull table
            self._pull_table = batch.cached(("features", be), lambda: self.backend.asarray(
                batch.forest.features, dtype=self.dtype))
        elif low.pulls:
            self._pull_table = self._params[EMBEDDING]
            if low.shared is not None:
                low.batch.tokens = tokens.BatchTokens(self._pull_plan, self._pull_table,
                                                      batch.cached(("token ranges", be, *key), dict),
                                                      self.backend, self.dtype)
        degree = batch.cached(("degree", be), lambda: self.backend.asarray(sched.degree[:, None], dtype=self.dtype)) \
            if any(n.op == "num_children" for n in low.sources) else None
        self.timings.construct_s += time.perf_counter() - t0
        low.buffers.bind(sched.num_rows, sched.num_edges, self._params)
        self._fill_sources(degree, train)

    def _check_batch(self, batch) -> None:
        """A batch made by another model (another vertex function, sizes, head) is refused; one made
        without a model has its labels and tokens checked against this one (out of range, the loss
        and the lookup would read past their tables)."""
        if not isinstance(batch, Batch):
            raise TypeError(f"the engine takes a cavs.Batch, got {type(batch).__name__}: make one with "
                            f"engine.model.make_batch(graphs) (a list of cavs.Graph)")
        made_by = batch.model
        if made_by is None:       # a Batch built by hand: its labels and tokens checked once, as make_batch does
            batch.cached(("checked", self.model.signature), lambda: self.model._check(batch.forest))
        elif made_by is not self.model and made_by.signature != self.model.signature:
            raise ValueError(f"this batch was made by model {made_by.describe()}, but this engine runs model "
                             f"{self.model.describe()}: make the batch with the engine's model "
                             f"(engine.model.make_batch)")

    def _rows_in(self, values, width, what: str, batch=None):
        """A (num_vertices, width) array from the caller (NumPy, CuPy or torch), on the backend in
        the engine's dtype, checked: its shape, and every value finite (naming the graph and
        vertex of the first that is not)."""
        if hasattr(values, "detach"):          # a torch tensor: its memory, without a copy on the CPU
            values = self._from_torch(values.detach(), what)
        given = type(values).__name__
        if not hasattr(values, "dtype"):        # a list: its dtype is known once it is an array
            values = np.asarray(values)
        if values.dtype.kind not in "biuf":     # None in an object array would become NaN, a str fail in NumPy
            raise ValueError(f"{what} must be a numeric array, got {given} of dtype {values.dtype}")
        values = self.backend.asarray(values, dtype=self.dtype) if self.backend.name != "numpy" \
            else np.asarray(values, dtype=self.dtype)
        forest = (batch or self._forwarded).forest
        n = forest.num_vertices
        if values.ndim != 2 or values.shape[0] != n or (width is not None and values.shape[1] != width):
            want = f"({n}, {width if width is not None else 'D'})"
            raise ValueError(f"{what} must be a {want} array, one row per vertex of the batch, got shape "
                             f"{tuple(values.shape)}")
        if width is None and values.shape[1] != self._pull_width:
            pulls = f"pulls {self._pull_width} values per vertex" if self._pull_width else "pulls nothing"
            raise ValueError(f"{what} has {values.shape[1]} columns, but the vertex function {pulls}")
        finite = self.xp.isfinite(values).all(axis=1)
        if not bool(finite.all()):
            v = int(self.backend.to_numpy(self.xp.flatnonzero(~finite))[0])
            i = int(np.searchsorted(forest.offsets, v, side="right")) - 1
            raise ValueError(f"{what}: {forest.names[i]}: vertex {v - int(forest.offsets[i])} (row {v}) has a "
                             "non-finite value")
        return values

    def _from_torch(self, tensor, what: str):
        """A torch tensor as an array of the backend: cast by torch where NumPy has no such dtype
        (bfloat16 from autocast, float8) or the engine computes in another; from the CPU for NumPy,
        from CUDA (DLPack, no copy) or the CPU (a copy) for CuPy."""
        import torch                            # already imported: the caller holds a tensor
        device = tensor.device.type
        if tensor.dtype.is_complex:
            raise ValueError(f"{what} must be a real tensor, got {tensor.dtype}")
        if device not in ("cpu", "cuda") or (self.backend.name == "numpy" and device != "cpu"):
            on = "the CPU (NumPy)" if self.backend.name == "numpy" else "a CUDA GPU (CuPy)"
            raise ValueError(f"{what} is a tensor on {tensor.device}; this engine computes on {on}: move it there "
                             f"(.{'cpu' if self.backend.name == 'numpy' else 'cuda'}())")
        if tensor.dtype.is_floating_point and tensor.dtype != getattr(torch, self.dtype.name):
            tensor = tensor.to(getattr(torch, self.dtype.name))
        return self.xp.from_dlpack(tensor) if device == "cuda" else tensor.numpy()      # NumPy took CPU tensors only

    @property
    def _pull_width(self):
        return self.model.F.input_width

    def _needs_head(self, what: str) -> None:
        if not self.model.has_head:
            raise ValueError(f"engine.{what} applies the built-in softmax head, and {self.model.describe()} has "
                             "none (classes=None): use engine.forward / engine.backward (or cavs.torch) with a "
                             "head of your own")

    def _squares(self, row_grads) -> dict:
        """Each gradient's sum of squares (the embedding's rows under EMBEDDING): one pass over
        the gradients serves the finiteness check and the optimizer's clipping."""
        xp = self.xp
        out = {k: float(xp.vdot(g.ravel(), g.ravel())) for k, g in self._grads.items()}
        if row_grads is not None:
            out[EMBEDDING] = out.get(EMBEDDING, 0.0) + float(xp.vdot(row_grads.ravel(), row_grads.ravel()))
        return out

    def _nonfinite_message(self, batch, loss, row_grads) -> str:
        names = batch.forest.names
        what = f"the batch of {len(names)} graphs ({names[0]}, ...)"
        after = ("the parameters were not updated (Engine(on_nonfinite='skip') skips such steps; a smaller "
                 "learning rate or clipping avoids them)")
        if not np.isfinite(loss):
            return f"{what} gives a loss of {loss}, which is not finite; {after}"
        grads = {**self._grads, **({} if row_grads is None else {EMBEDDING: row_grads})}
        bad = [k for k, g in grads.items() if not bool(self.xp.isfinite(g).all())]
        return (f"{what} gives a finite loss ({loss:.6g}) but gradients that are not finite ({', '.join(bad)}): the "
                f"backward pass overflowed {self.dtype.name} (on deep graphs whose vertices have several parents "
                f"gradients add up along every path; a model with dtype='float64' has more range); {after}")

    def _finite(self, loss, squares: dict, row_grads) -> bool:
        xp = self.xp
        if not np.isfinite(loss):
            return False
        if np.isfinite(sum(squares.values())):
            return True
        # the squares' sum overflows (float32: from |g| ~ 1e19) before any gradient does
        grads = [*self._grads.values(), *([] if row_grads is None else [row_grads])]
        return all(bool(xp.isfinite(g).all()) for g in grads)

    def _fill_sources(self, degree, train: bool):
        """num_children: each vertex's degree; dropout masks: drawn anew for a training pass,
        ones otherwise."""
        low, A = self._low, self._low.arrays
        for n in low.sources:
            buf = A[low.slot[n]]
            if n.op == "num_children":
                buf[:self._sched.num_rows] = degree
                continue
            rows = self._sched.num_edges if n.on_edges else self._sched.num_rows
            if not train:
                buf[:rows] = 1
                continue
            rate = n.attrs["rate"]
            keep = self._rng.random((rows, n.shape[0])) >= rate
            buf[:rows] = self.backend.asarray(keep * (1.0 / (1.0 - rate)), dtype=self.dtype)

    def _forward(self, want_grad: bool, predict: bool = False):
        low, A = self._low, self._low.arrays
        t0 = time.perf_counter()
        for p in low.pulls:                  # F's entry: the embedding lookup fills the pull buffer
            buf, plan = A[low.slot[p]], self._pull_plan
            if low.batch.tokens is not None:     # only shared products read it: they look up the
                self.counters.kernels["pull"] += 1    # distinct words' rows themselves (tokens.py)
                self.counters.bytes_moved["pull"] += len(plan.unique_host) * buf.shape[1] * self.dtype.itemsize
                continue
            if plan.prefix is not None:
                self.backend.take_rows(self._pull_table, plan.tokens, buf[:plan.prefix])
            else:
                buf[plan.rows] = self._pull_table[plan.tokens]
            if len(plan.zero_rows):             # rows without input that some task reads as zeros
                buf[plan.zero_rows] = 0
            self.counters.kernels["pull"] += 1
            self.counters.bytes_moved["pull"] += plan.num_rows * buf.shape[1] * self.dtype.itemsize
        self.timings.memory_s += time.perf_counter() - t0
        self._run(low.forward_phases)
        return None if predict else self._loss(want_grad)

    def _run(self, phase_items, reverse: bool = False):
        the_plan = planning.plan(self._low, phase_items, self._low.batch)
        planning.run(the_plan, self._sched, self.backend, self.options["streaming"], reverse)

    def _loss(self, want_grad: bool):
        low, A, plan = self._low, self._low.arrays, self._loss_plan
        t0 = time.perf_counter()
        pushed = A[low.slot[low.pushed]][:self._sched.num_rows]
        h = pushed if plan.all_rows else pushed[plan.rows]     # F's exit: read the pushed rows
        self.counters.bytes_moved["push"] += 0 if plan.all_rows else h.nbytes
        self.timings.memory_s += time.perf_counter() - t0
        # "mean": the average over the batch's labelled vertices (docs/workloads.md); "sum": their sum
        scale = 1.0 / max(1, len(plan.labels)) if self.model.reduction == "mean" else 1.0
        kw = {}
        if want_grad:      # the gradients go where they are read: dh into d(push), dW and db into the accumulators
            dpush = A[low.slot[low.dpush]][:self._sched.num_rows]
            kw = {"dw_acc": self._grads["Wout"], "db_acc": self._grads["bout"],
                  "dh_out": dpush if plan.all_rows else None}
        loss, dh, dw, db = softmax_cross_entropy(self.backend, h, self._params["Wout"], self._params["bout"],
                                                 plan.labels, want_grad, scale, **kw)
        self.counters.kernels["loss"] += 1
        if want_grad and not plan.all_rows:
            dpush.fill(0)
            dpush[plan.rows] = dh
        return loss

    def _backward(self):
        low, A, n_rows = self._low, self._low.arrays, self._sched.num_rows
        A[low.slot[low.dstate]][:n_rows].fill(0)
        if low.batch.tokens is not None:     # the shared input gradients add into it (tokens.py)
            low.batch.tokens.start_backward(self._pull_width)
        self._run(low.backward_phases, reverse=True)
        self._emb_grad = None
        if low.dpull is not None and not self.model.uses_features and low.batch.tokens is None:
            t0 = time.perf_counter()
            plan = self._pull_plan
            d = A[low.slot[low.dpull]]
            self._emb_grad = d[:plan.prefix] if plan.prefix is not None else d[plan.rows]
            self.counters.bytes_moved["push"] += self._emb_grad.nbytes
            self.timings.memory_s += time.perf_counter() - t0

    def _row_grads(self):
        """The embedding's gradient as one summed row per distinct token read: (rows, grads)."""
        tok = self._low.batch.tokens
        if tok is not None and tok.grad is not None:
            return self._pull_plan.unique_tokens, tok.grad
        if self._emb_grad is None:
            return None, None
        plan = self._pull_plan
        compact = self.xp.zeros((len(plan.unique_tokens), self._emb_grad.shape[1]), dtype=self.dtype)
        self.backend.add_rows(compact, plan.token_slot, self._emb_grad)
        return plan.unique_tokens, compact


class ParamView(MutableMapping):
    """engine.params: {name: numpy array}; assigning an array sets the weights."""

    def __init__(self, engine):
        self._e = engine

    def __getitem__(self, name):
        return self._e.backend.to_numpy(self._array(name))

    def _array(self, name):
        try:
            return self._e._params[name]
        except KeyError:
            raise KeyError(f"no parameter {name!r}; {self._e.model.describe()} has "
                           f"{', '.join(self._e._params)}") from None

    def __setitem__(self, name, value):
        old = self._array(name)
        value = np.asarray(value)
        if value.dtype.kind not in "iuf":       # a str or None fails in isfinite; complex would drop its imaginary part
            raise ValueError(f"parameter {name} takes real numbers, got an array of dtype {value.dtype}")
        if value.shape != tuple(old.shape):
            raise ValueError(f"parameter {name} has shape {tuple(old.shape)}, got {value.shape}")
        check_finite(name, value)
        self._e._params[name] = self._e.backend.parameter(value, dtype=old.dtype)

    def __delitem__(self, name):
        raise TypeError("parameters cannot be removed")

    def __iter__(self):
        return iter(self._e._params)

    def __len__(self):
        return len(self._e._params)
