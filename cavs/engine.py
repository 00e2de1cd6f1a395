"""Runs F and dF over the tasks of a batch's schedule.

analysis.py decides once where each op runs (eager, loop, lazy), which concat parts live in their
concat's columns and which sums of matmuls share one buffer. Per batch, support.py says what each
op computes, zero-fills, passes through or skips on each task; the engine turns that into closures
per task (cached by the task's signature) and runs them: the eager phase once over all rows, the
task loop (forward in task order, backward in reverse), the lazy phase once over all rows. The loss
sits outside F (loss.py), the update in the optimizer (optim.py). Because every dynamic tensor
holds all rows in task order, an op over "all rows" and the same op over each task's rows compute
the same numbers (only the summation order of reductions differs).
"""
from __future__ import annotations

import functools
import json
import time
from collections.abc import MutableMapping

import numpy as np

from . import blas as cpu_blas
from . import fusion, optim
from .analysis import PHASES, affine_sums, concat_homes, phases
from .backend import get_backend
from .grad import GradientFunction
from .loss import softmax, softmax_cross_entropy, warm_up as loss_warm_up
from .model import EMBEDDING
from .memory import Counters, DynamicTensor, LossPlan, MessagePlans, PullPlan, Timings
from .ops import OPS, Node
from .scheduler import POLICIES
from .support import COMPUTE, PASS, ROW_SUBSET_OPS, SKIP, ZERO, actions, ranges, row_bounds

STREAM_CHUNKS = 4      # streaming: eager work is cut into this many pieces along the task order
# A fused group that computes only in part on some tasks (a leaf has no children, an n-ary vertex
# uses 3 of 32 child slots) gets a smaller kernel for that combination of members: one Numba
# compile (0.3-6 s) per combination. With many child slots the combinations multiply, so only a
# combination that covers at least this share of a batch's rows gets its own kernel; the rarer
# ones run member by member. (Binary Tree-LSTM: the leaves' combination is ~half the rows.)
VARIANT_MIN_SHARE = 0.1
# A product bounded by child slot k (support.row_bounds) runs on the rows with child k alone when
# they are at most this share of its rows; above it, copying them out costs more than it saves.
SUBSET_MAX_SHARE = 0.8


class ParamView(MutableMapping):
    """engine.params: {name: numpy array}; assigning an array sets the weights."""

    def __init__(self, engine):
        self._e = engine

    def __getitem__(self, name):
        return self._e.backend.to_numpy(self._e._params[name])

    def __setitem__(self, name, value):
        old = self._e._params[name]
        value = np.asarray(value)
        if value.shape != tuple(old.shape):
            raise ValueError(f"parameter {name} has shape {tuple(old.shape)}, got {value.shape}")
        self._e._params[name] = self._e.backend.asarray(value, dtype=old.dtype)

    def __delitem__(self, name):
        raise TypeError("parameters cannot be removed")

    def __iter__(self):
        return iter(self._e._params)

    def __len__(self):
        return len(self._e._params)


class Engine:
    """Batched training and inference of one model's vertex function over input graphs."""

    def __init__(self, model, backend: str | None = None, policy: str = "batched", *,
                 optimizer: "optim.Optimizer | None" = None,
                 lazy: bool = True, eager: bool = True, fusion: bool | None = None,
                 streaming: bool | None = None, threads: int | None = None, blas: str | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {POLICIES}")
        self.model, self.policy = model, policy
        # WORKLOADS.md's rule by default: SGD, lr 1.0, gradients clipped to a global norm of 5.0
        self.optimizer = optimizer if optimizer is not None else optim.SGD(lr=1.0, clip_norm=5.0)
        self.backend = get_backend(backend)
        # defaults = the fastest combination measured (README): fusion everywhere (on the CPU the
        # generated Numba kernels beat NumPy's per-op loops 3-4x on the cell's elementwise work);
        # streaming only on the GPU (on the CPU a second thread's contention outweighs the overlap)
        on_gpu = self.backend.name == "cupy"
        self.options = {"lazy": lazy, "eager": eager,
                        "fusion": True if fusion is None else fusion,
                        "streaming": on_gpu if streaming is None else streaming}
        self.xp = self.backend.xp
        if threads:      # BLAS threads for this process (the benchmarks pin 1)
            from threadpoolctl import threadpool_limits
            self._threads = threadpool_limits(threads)
            self.backend.set_threads(threads)
        self.dtype = np.dtype(model.dtype)
        self._params = {k: self.backend.asarray(v, dtype=self.dtype) for k, v in model.init_params().items()}
        self.params = ParamView(self)
        # gradient accumulators, zeroed in place per batch (reduce steps hold references to them);
        # the embedding's gradient is per row read (sparse), see _backward
        self._grads = {k: self.xp.zeros_like(v) for k, v in self._params.items() if k != EMBEDDING}
        self.optimizer.bind(self.xp, self._params)
        if self.backend.name == "numpy":     # the fastest library per product shape (blas.py), measured once
            self.backend.use_gemm(cpu_blas.choose(self._gemm_keys(model), self.dtype, threads, blas))
        elif blas not in (None, "auto"):
            raise ValueError(f"blas={blas!r} chooses among CPU libraries; the {self.backend.name} backend "
                             f"multiplies with {self.backend.blas}")
        self.counters = Counters()
        self.timings = Timings(memory_s=0.0)
        self._compile(model.F, model.dF)

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
        h, c = model.param_shapes["Wout"]
        shapes |= {("nn", h, c), ("nt", c, h), ("tn", h, c)}
        return [(layout, rows, inner, outer) for layout, inner, outer in shapes for rows in cpu_blas.ROW_CLASSES]

    # ------------------------------------------------------------ compile: storage and phases

    def _compile(self, F, dF: GradientFunction):
        nodes = F.nodes + dF.nodes
        self._slot = {n: i for i, n in enumerate(nodes)}
        self._home = concat_homes(nodes)
        # concats whose parts all live in their columns: nothing to copy (a zero-fill still runs
        # on tasks where the concat is known zero, as its parts are then skipped)
        self._elided = {n for n in nodes if n.op == "concat"
                        and all(self._home.get(p, (None,))[0] is n for p in n.inputs)}
        self._consumers: dict[Node, list[Node]] = {}
        for n in nodes:
            for i in n.inputs:
                self._consumers.setdefault(i, []).append(n)
        # with fusion on, matmul sums are computed in their root's buffer (affine_sums)
        self._affine = {a.root: a for a in affine_sums(nodes, self._consumers)} if self.options["fusion"] else {}
        self._sum_of = {n: a for a in self._affine.values() for n in a.terms + a.inner}
        # products and parameter gradients that are zero outside the rows with some child k
        self._bound = {n: ks for n, ks in row_bounds(nodes).items() if n.op in ROW_SUBSET_OPS}
        self._row_sets = {}      # per batch: (slots, a, b) -> the rows with those children
        self._tensors: dict[Node, DynamicTensor] = {}
        for n in nodes:
            if n.is_vertex and n.op != "slice" and n not in self._home and n not in self._sum_of:
                self._tensors[n] = DynamicTensor(self.backend, n.shape[0], self.dtype)
        self._state = F.scatter.inputs[0]
        self._pushed = F.push.inputs[0] if F.push is not None else None
        self._dstate = next(n for n in dF.nodes if n.op == "gather_grad_state")
        self._dpush = next((n for n in dF.nodes if n.op == "pull_grad_output"), None)
        self._dpull = next((n.inputs[0] for n in dF.nodes if n.op == "push_grad_input"), None)
        self._pulls = [n for n in F.nodes if n.op == "pull"]

        self._arrays: list = [None] * len(nodes)
        self._based: list = [None] * len(nodes)      # fusion on the CPU: (buffer, column) per value
        self._rows_bound = -1
        fwd = phases(F.nodes, {n for n in F.nodes if n.op == "gather"}, {F.scatter})
        bwd = phases(dF.nodes, {self._dstate}, {n for n in dF.nodes if n.op == "scatter_grad_child"})
        self.phase_of = {**fwd, **bwd}
        # an affine sum's first term to run writes, the others accumulate: order them by phase
        where = self._where()
        for a in self._affine.values():
            a.terms.sort(key=lambda t: PHASES.index(where[self.phase_of[t]]))
        self.forward_phases = self._phase_items(F.nodes, fwd)
        self.backward_phases = self._phase_items(dF.nodes, bwd)
        if self.backend.name == "numpy":
            # Numba's start-up and the kernels (from the on-disk cache, or compiled) now, at
            # construction, not in the first step
            if self.options["fusion"]:
                fusion.warm_up([it for ph in (self.forward_phases, self.backward_phases) for items in ph.values()
                                for it in items if isinstance(it, fusion.FusedGroup)], self.dtype.name,
                               cached_only=True)
            if self.dtype.name in ("float32", "float64"):
                loss_warm_up(self.dtype.name)
        self._fns = {}            # (node, action) -> closure
        self._task_fns = {}       # loop signature -> closures, shared by tasks alike in what they skip
        self._subgroups = {}      # (fused group, its computing members) -> the smaller fused group

    def _where(self) -> dict[str, str]:
        """Where each phase's ops run: switched-off phases fold into the loop."""
        return {"eager": "eager" if self.options["eager"] else "loop", "loop": "loop",
                "lazy": "lazy" if self.options["lazy"] else "loop"}

    def _phase_items(self, nodes, phase_of) -> dict[str, list]:
        """Per phase, its ops in topological order (switched-off phases fold into the loop);
        with fusion on, each fused group of elementwise ops is one item."""
        where = self._where()
        items = {}
        for p in PHASES:
            ops = [n for n in nodes if n in phase_of and where[phase_of[n]] == p]
            fusable = [n for n in ops if n not in self._affine and n not in self._sum_of]
            groups = fusion.bounded(fusion.find_groups(fusable, self._consumers), self._consumers) \
                if self.options["fusion"] else []
            items[p] = fusion.contracted_order(ops, groups)
        return items

    def _compute_fn(self, n: Node):
        """A closure running node n on rows [a, b) of task t."""
        be, A, kernels = self.backend, self._arrays, self.counters.kernels
        o, op = self._slot[n], n.op
        if op == "gather":
            return self._gather_step(n)
        if op == "scatter_grad_child":
            return self._scatter_grad_step(n)
        if op == "concat":
            return self._concat_step(n)
        run = OPS[op].run
        ins = [(self._slot[i], i.is_param) for i in n.inputs]
        if OPS[op].kind == "reduce":
            grad = self._grads[n.attrs["param"]]

            def step(a, b, t):
                run(be, grad, *[A[s] if p else A[s][a:b] for s, p in ins])
                kernels[op] += 1
        else:
            def step(a, b, t):
                run(be, A[o][a:b], *[A[s] if p else A[s][a:b] for s, p in ins])
                kernels[op] += 1
        return self._subset_fn(n, step) if n in self._bound else step

    def _rows_with_children(self, n: Node, a: int, b: int):
        """The rows of [a, b) whose vertex has one of the children that bound n
        (support.row_bounds), as an index array, or None where they are nearly all rows (then
        copying them out costs more than the products it saves). Cached per batch."""
        key = (self._bound[n], a, b)
        rows = self._row_sets.get(key)
        if rows is None:
            present = (self._sched.child_rows[a:b, sorted(key[0])] >= 0).any(axis=1)
            count = int(present.sum())
            rows = False if count > SUBSET_MAX_SHARE * (b - a) else self.backend.index(np.flatnonzero(present))
            self._row_sets[key] = rows
        return None if rows is False else rows

    def _subset_fn(self, n: Node, full_step):
        """A product or parameter gradient whose vertex input is zero on every row without
        certain children (support.row_bounds): where few rows have them, it multiplies those rows
        alone (copied out, and back into the output, whose other rows get zeros); the same
        numbers as `full_step` over all rows, without its multiplications by zero rows."""
        be, A, kernels, xp = self.backend, self._arrays, self.counters.kernels, self.xp
        o, op = self._slot[n], n.op
        run = OPS[op].run
        ins = [(self._slot[i], i.is_param) for i in n.inputs]
        reduce = OPS[op].kind == "reduce"
        grad = self._grads[n.attrs["param"]] if reduce else None

        def subset_step(a, b, t):
            rows = self._rows_with_children(n, a, b)
            if rows is None:
                full_step(a, b, t)
                return
            args = [A[s] if p else A[s][a:b][rows] for s, p in ins]
            if reduce:
                run(be, grad, *args)
            else:
                out = A[o][a:b]
                part = xp.empty((len(rows), out.shape[1]), dtype=out.dtype)
                run(be, part, *args)
                out.fill(0)
                out[rows] = part
            kernels[op + "-rows"] += 1
        return subset_step

    def _concat_step(self, n: Node):
        """Copies the parts that are not stored in the concat's columns already (concat_homes)."""
        A, kernels, o = self._arrays, self.counters.kernels, self._slot[n]
        copies, col = [], 0
        for p in n.inputs:
            if self._home.get(p) != (n, col):
                copies.append((self._slot[p], col, col + p.shape[0]))
            col += p.shape[0]

        def concat(a, b, t):
            out = A[o]
            for s, c0, c1 in copies:
                out[a:b, c0:c1] = A[s][a:b]
            kernels["concat"] += 1
        return concat

    def _fused_fn(self, g: "fusion.FusedGroup"):
        """One generated kernel for a group: reads its inputs' rows, writes its outputs' rows."""
        A, kernels = self._arrays, self.counters.kernels
        ins = [self._slot[i] for i in g.inputs]
        outs = [self._slot[o] for o in g.outputs]
        if self.backend.name == "cupy":
            kernel = fusion.compile_cupy(*fusion.cupy_source(g))
            params = [i.is_param for i in g.inputs]

            def fused_gpu(a, b, t):
                kernel(*[A[s] if p else A[s][a:b] for s, p in zip(ins, params)], *[A[s][a:b] for s in outs])
                kernels["fused"] += 1
            return fused_gpu
        kernel = fusion.compile_numba(fusion.numba_source(g), self.dtype.name)
        based = self._based
        params = {s for i, s in zip(g.inputs, ins) if i.is_param}

        def fused(a, b, t):
            args = []
            for s in ins:
                if s in params:
                    args.append(A[s])
                else:
                    args += based[s]
            for s in outs:
                args += based[s]
            kernel(a, b, *args)
            kernels["fused"] += 1
        return fused

    def _affine_fn(self, n: Node, how: str):
        """A term of an affine sum: "write" (the first on this task; adds the bias), or
        "accumulate"; or the root's "fill" where no term computes (the bias, or zeros)."""
        A, be, kernels = self._arrays, self.backend, self.counters.kernels
        s = self._affine.get(n) or self._sum_of[n]
        o, bias = self._slot[s.root], None if s.bias is None else self._slot[s.bias]
        if how == "fill":
            def fill(a, b, t):
                A[o][a:b] = A[bias] if bias is not None else 0
                kernels["bias-fill" if bias is not None else "zero-fill"] += 1
            return fill
        x, w = self._slot[n.inputs[0]], self._slot[n.inputs[1]]
        accumulate = how == "accumulate"
        bounded = n in self._bound

        def term(a, b, t):
            rows = self._rows_with_children(n, a, b) if bounded else None
            if rows is None:
                be.gemm(A[o][a:b], A[x][a:b], A[w], accumulate=accumulate,
                        bias=None if accumulate or bias is None else A[bias])
                kernels["matmul"] += 1
                return
            out = A[o][a:b]            # a term that is zero outside `rows` (see _subset_fn)
            part = self.xp.empty((len(rows), out.shape[1]), dtype=out.dtype)
            be.gemm(part, A[x][a:b][rows], A[w])
            if not accumulate:
                out[...] = A[bias] if bias is not None else 0
            out[rows] += part
            kernels["matmul-rows"] += 1
        return term

    def _affine_fns(self, n: Node, action_of) -> list:
        """The closures of an affine sum's node on one task, from the actions of its terms."""
        s = self._affine.get(n) or self._sum_of[n]
        if n in s.inner or action_of(n) == SKIP:
            return []
        computing = [t for t in s.terms if action_of(t) == COMPUTE]
        if n is s.root:
            return [] if computing else [self._fn(n, "fill")]
        if n not in computing:
            return []
        return [self._fn(n, "accumulate" if computing[0] is not n else "write")]

    def _pass_fn(self, n: Node, source: Node):
        """An add whose other input is known zero on these rows: a copy of this one."""
        A, o, s, kernels = self._arrays, self._slot[n], self._slot[source], self.counters.kernels

        def copy(a, b, t):
            A[o][a:b] = A[s][a:b]
            kernels["copy"] += 1
        return copy

    def _zero_fn(self, n: Node):
        A, o, kernels = self._arrays, self._slot[n], self.counters.kernels

        def zero(a, b, t):
            A[o][a:b].fill(0)
            kernels["zero-fill"] += 1
        return zero

    def _gather_step(self, n: Node):
        A, k, be, counters = self._arrays, n.attrs["k"], self.backend, self.counters
        o, state, row_bytes = self._slot[n], self._slot[self._state], n.shape[0] * self.dtype.itemsize

        def gather(a, b, t):
            t0 = time.perf_counter()
            plan = self._plans.plans[t][k]
            out = A[o][a:b]
            if plan.mode == "all":
                be.take_rows(A[state], plan.child_rows, out)
                moved = b - a
            elif plan.mode == "none":
                out.fill(0)
                moved = 0
            else:
                out.fill(0)
                out[plan.positions] = A[state][plan.child_rows]
                moved = len(plan.child_rows)
            counters.kernels["gather"] += 1
            counters.bytes_moved["gather"] += moved * row_bytes
            self.timings.memory_s += time.perf_counter() - t0
        return gather

    def _scatter_grad_step(self, n: Node):
        A, k, be, counters = self._arrays, n.attrs["k"], self.backend, self.counters
        dy, dstate, row_bytes = self._slot[n.inputs[0]], self._slot[self._dstate], n.shape[0] * self.dtype.itemsize

        def scatter_grad(a, b, t):
            plan = self._plans.plans[t][k]
            if plan.mode == "none":
                return
            t0 = time.perf_counter()
            g = A[dy][a:b]
            if plan.mode == "some":
                g = g[plan.positions]
            be.add_rows(A[dstate], plan.child_rows, g, plan.unique)
            counters.kernels["scatter"] += 1
            counters.bytes_moved["scatter"] += len(g) * row_bytes
            self.timings.memory_s += time.perf_counter() - t0
        return scatter_grad

    # ------------------------------------------------------------ per batch: memory binding

    def _prepare(self, batch, predict: bool = False):
        """This batch's schedule and plans (cached on the batch). `predict` computes the pushed
        output at every vertex, not only where a label is."""
        t0 = time.perf_counter()
        self.backend.new_pass()             # parameters may have changed: packed weights are stale
        be, key = self.backend.name, (self.policy, id(self.model), predict)
        self._sched = batch.schedule(self.policy)
        self._row_sets = {}
        self._plans = batch.cached(("plans", self.policy, be), lambda: MessagePlans(self._sched, self.backend))
        self._loss_plan = batch.cached(("loss", self.policy, be), lambda: LossPlan(self._sched, self.backend))
        self._actions = batch.cached(("actions", *key),
                                     lambda: actions(self.model.F, self.model.dF, self._sched, predict))
        pull_read = np.logical_or.reduce([self._actions[p] != SKIP for p in self._pulls]) \
            if self._pulls else np.zeros(self._sched.num_tasks, dtype=bool)
        self._pull_plan = batch.cached(("pull", be, *key), lambda: PullPlan(self._sched, self.backend, pull_read))
        if self.model.uses_features:     # the batch's features are its pull table
            self._pull_table = batch.cached(("features", be), lambda: self.backend.asarray(
                batch.forest.features, dtype=self.dtype))
        elif self._pulls:
            self._pull_table = self._params[EMBEDDING]
        self.timings.construct_s += time.perf_counter() - t0
        self._bind(self._sched.num_rows)

    def _bind(self, rows: int):
        """Reserves every dynamic tensor for `rows` rows and rebuilds the views when one moved."""
        moved = [t.reserve(rows) for t in self._tensors.values()]
        if any(moved) or self._rows_bound < 0:
            A = self._arrays
            for n, i in self._slot.items():
                if n.is_param:
                    A[i] = self._params[n.attrs["name"]]
                elif n in self._tensors:
                    A[i] = self._tensors[n].buffer
            for n in self._slot:               # concat parts: views of their concat's columns
                if n in self._home:
                    A[self._slot[n]] = self._home_view(n)
            for n, a in self._sum_of.items():   # affine sums: one buffer, the root's
                A[self._slot[n]] = A[self._slot[a.root]]
            for n, i in self._slot.items():   # views: slices of their input's columns
                if n.op == "slice":
                    A[i] = A[self._slot[n.inputs[0]]][:, n.attrs["start"]:n.attrs["stop"]]
            if self.options["fusion"] and self.backend.name == "numpy":
                self._bind_bases()
            self._rows_bound = rows
        for n, i in self._slot.items():        # parameters may have been reassigned
            if n.is_param:
                self._arrays[i] = self._params[n.attrs["name"]]

    def _bind_bases(self):
        """For the CPU's fused kernels: each vertex value as (its C-contiguous buffer, first column);
        parameters are read from A at each call, as they may be reassigned between batches."""
        A, itemsize = self._arrays, self.dtype.itemsize
        for n, i in self._slot.items():
            a = A[i]
            if a is None or n.is_param:
                continue
            root = a if a.base is None else a.base
            col = (a.__array_interface__["data"][0] - root.__array_interface__["data"][0]) // itemsize
            self._based[i] = (root, col)

    def _home_view(self, n: Node):
        concat, col = self._home[n]
        base = self._home_view(concat) if concat in self._home else self._tensors[concat].buffer
        return base[:, col:col + n.shape[0]]

    def _fn(self, item, action):
        key = (item, action)
        if key not in self._fns:
            if isinstance(action, str):
                self._fns[key] = self._affine_fn(item, action)
            elif isinstance(item, fusion.FusedGroup):
                self._fns[key] = self._fused_fn(item)
            elif action >= PASS:
                self._fns[key] = self._pass_fn(item, item.inputs[action - PASS])
            else:
                self._fns[key] = self._compute_fn(item) if action == COMPUTE else self._zero_fn(item)
        return self._fns[key]

    def _item_fns(self, item, action_of, variants: bool = True) -> list:
        """Closures for one item given each member's action: a fused group runs as one kernel
        where all its members compute; where some do, as one smaller kernel of those (compiled
        once per such combination, if `variants`) or member by member."""
        if isinstance(item, fusion.FusedGroup):
            acts = tuple(action_of(m) for m in item.nodes)
            if all(a == COMPUTE for a in acts):
                return [self._fn(item, COMPUTE)]
            # e.g. at the leaves, where the forget gates are skipped: zero-fill what must read as
            # zero, then one kernel for the members that compute or pass an input through
            zeros = [self._fn(m, ZERO) for m, a in zip(item.nodes, acts) if a == ZERO]
            running = [(m, a) for m, a in zip(item.nodes, acts) if a == COMPUTE or a >= PASS]
            if sum(a == COMPUTE for _, a in running) < 2 or not variants:
                return zeros + [self._fn(m, a) for m, a in running]
            key = (item, tuple(running))
            if key not in self._subgroups:
                passes = {m: a - PASS for m, a in running if a >= PASS}
                self._subgroups[key] = fusion.describe([m for m, _ in running], self._consumers, passes)
            return zeros + [self._fn(self._subgroups[key], COMPUTE)]
        if item in self._affine or item in self._sum_of:
            return self._affine_fns(item, action_of)
        a = action_of(item)
        return [] if a == SKIP or (a == COMPUTE and item in self._elided) else [self._fn(item, a)]

    def _plan(self, phase_items) -> dict:
        """This batch's work: (closure, a, b) for whole-batch phases, closures per loop task."""
        act, bounds = self._actions, self._sched.bounds
        plan = {}
        for phase in ("eager", "lazy"):
            plan[phase] = []
            for item in phase_items[phase]:
                if item in self._affine or item in self._sum_of:
                    plan[phase] += self._per_task_ranges(item)
                    continue
                members = item.nodes if isinstance(item, fusion.FusedGroup) else [item]
                if isinstance(item, fusion.FusedGroup) and all((act[m] == act[members[0]]).all() for m in members) \
                        and not (act[members[0]] >= PASS).any():
                    first = act[members[0]]         # one kernel where they compute
                    plan[phase] += [(self._fn(item, COMPUTE), a, b) for a, b in ranges(first == COMPUTE, bounds)]
                    plan[phase] += [(self._fn(o, ZERO), a, b) for o in item.outputs for a, b in ranges(first == ZERO, bounds)]
                    continue
                for m in members:                   # member by member, in topological order
                    for action in np.unique(act[m]):
                        if action == SKIP or (action == COMPUTE and m in self._elided):
                            continue
                        mask = act[m] == action
                        plan[phase] += [(self._fn(m, int(action)), a, b) for a, b in ranges(mask, bounds)]
        loop = phase_items["loop"]
        loop_nodes = [m for it in loop for m in (it.nodes if isinstance(it, fusion.FusedGroup) else [it])]
        loop_nodes += [t for a in self._affine.values() for t in a.terms if t not in loop_nodes]
        column = {m: k for k, m in enumerate(loop_nodes)}
        signatures = np.stack([act[n] for n in loop_nodes], axis=1) if loop_nodes \
            else np.zeros((self._sched.num_tasks, 0), dtype=np.int8)
        per_task = []
        sigs = list(map(tuple, signatures.tolist()))
        rows_of = {}
        for sig, n in zip(sigs, np.diff(bounds).tolist()):
            rows_of[sig] = rows_of.get(sig, 0) + n
        for sig in sigs:
            # partial fused kernels only for signatures that carry a real share of the rows
            variants = rows_of[sig] >= VARIANT_MIN_SHARE * self._sched.num_rows
            key = (id(loop), sig, variants)    # forward and backward loops have separate signatures
            if key not in self._task_fns:
                self._task_fns[key] = [f for it in loop
                                       for f in self._item_fns(it, lambda m: sig[column[m]], variants)]
            per_task.append(self._task_fns[key])
        plan["loop"] = per_task
        return plan

    def _per_task_ranges(self, item) -> list:
        """(closure, a, b) for a whole-batch phase, adjacent tasks with the same closure merged."""
        act, bounds, out = self._actions, self._sched.bounds, []
        for t in range(self._sched.num_tasks):
            for fn in self._item_fns(item, lambda m: act[m][t]):
                a, b = int(bounds[t]), int(bounds[t + 1])
                if out and out[-1][0] is fn and out[-1][2] == a:
                    out[-1] = (fn, out[-1][1], b)
                else:
                    out.append((fn, a, b))
        return out

    def _run(self, plan, reverse=False):
        tasks = self._sched.tasks()
        order = list(range(len(tasks) - 1, -1, -1) if reverse else range(len(tasks)))
        wait = self._stream_eager(plan["eager"], tasks, order) if self.options["streaming"] else None
        if wait is None:
            for fn, a, b in plan["eager"]:
                fn(a, b, -1)
        loop = plan["loop"]
        for k, t in enumerate(order):
            if wait is not None:
                wait(k * STREAM_CHUNKS // len(order))
            a, b = tasks[t]
            for fn in loop[t]:
                fn(a, b, t)
        for fn, a, b in plan["lazy"]:
            fn(a, b, -1)

    def _stream_eager(self, eager, tasks, order):
        """Streaming: the eager ops run on a second stream in STREAM_CHUNKS chunks of tasks, in
        loop order; the loop waits only for the chunk holding its next task."""
        if not eager:
            return None
        chunks = []
        for c in range(STREAM_CHUNKS):
            mine = [t for k, t in enumerate(order) if k * STREAM_CHUNKS // len(order) == c]
            if not mine:
                chunks.append([])
                continue
            lo, hi = tasks[min(mine)][0], tasks[max(mine)][1]
            chunks.append([functools.partial(fn, max(a, lo), min(b, hi), -1)
                           for fn, a, b in eager if max(a, lo) < min(b, hi)])
        return self.backend.stream(chunks)

    # ------------------------------------------------------------ forward, loss, backward

    def _forward(self, want_grad: bool, predict: bool = False):
        A = self._arrays
        t0 = time.perf_counter()
        for p in self._pulls:                # F's entry: the embedding lookup fills the pull buffer
            buf, plan = A[self._slot[p]], self._pull_plan
            if plan.prefix is not None:
                self.backend.take_rows(self._pull_table, plan.tokens, buf[:plan.prefix])
            else:
                buf[plan.rows] = self._pull_table[plan.tokens]
            if len(plan.zero_rows):             # rows without input that some task reads as zeros
                buf[plan.zero_rows] = 0
            self.counters.kernels["pull"] += 1
            self.counters.bytes_moved["pull"] += plan.num_rows * buf.shape[1] * self.dtype.itemsize
        self.timings.memory_s += time.perf_counter() - t0
        self._run(self._plan(self.forward_phases))
        return None if predict else self._loss(want_grad)

    def _loss(self, want_grad: bool):
        A, plan = self._arrays, self._loss_plan
        t0 = time.perf_counter()
        pushed = A[self._slot[self._pushed]][:self._sched.num_rows]
        h = pushed if plan.all_rows else pushed[plan.rows]     # F's exit: read the pushed rows
        self.counters.bytes_moved["push"] += 0 if plan.all_rows else h.nbytes
        self.timings.memory_s += time.perf_counter() - t0
        # "mean": the average over the batch's labelled vertices (WORKLOADS.md); "sum": their sum
        scale = 1.0 / max(1, len(plan.labels)) if self.model.reduction == "mean" else 1.0
        kw = {}
        if want_grad:      # the gradients go where they are read: dh into d(push), dW and db into the accumulators
            dpush = A[self._slot[self._dpush]][:self._sched.num_rows]
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
        A, n_rows = self._arrays, self._sched.num_rows
        A[self._slot[self._dstate]][:n_rows].fill(0)
        self._run(self._plan(self.backward_phases), reverse=True)
        self._emb_grad = None
        if self._dpull is not None and not self.model.uses_features:   # d(pull) to the embedding rows
            t0 = time.perf_counter()
            plan = self._pull_plan
            d = A[self._slot[self._dpull]]
            self._emb_grad = d[:plan.prefix] if plan.prefix is not None else d[plan.rows]
            self.counters.bytes_moved["push"] += self._emb_grad.nbytes
            self.timings.memory_s += time.perf_counter() - t0

    def _row_grads(self):
        """The embedding's gradient as one summed row per distinct token read: (rows, grads)."""
        if self._emb_grad is None:
            return None, None
        plan = self._pull_plan
        compact = self.xp.zeros((len(plan.unique_tokens), self._emb_grad.shape[1]), dtype=self.dtype)
        self.backend.add_rows(compact, plan.token_slot, self._emb_grad)
        return plan.unique_tokens, compact

    # ------------------------------------------------------------ public API

    def loss_and_grads(self, batch):
        """(loss, {parameter name: gradient as a numpy array}) for one batch."""
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
        """One update with the engine's optimizer; returns the loss before the update."""
        loss = self._pass(batch)
        t0 = time.perf_counter()
        rows, row_grads = self._row_grads()
        self.optimizer.update(self.backend, self._params, self._grads,
                              EMBEDDING if rows is not None else None, rows, row_grads)
        self.backend.synchronize()
        self.timings.compute_s += time.perf_counter() - t0
        return loss

    def infer(self, batch) -> float:
        """Forward and loss only."""
        return self._pass(batch, train=False)

    def predict(self, batch) -> list:
        """Per graph of the batch, a (num_vertices, classes) array of softmax probabilities of
        the head on what each vertex pushed, rows in the graph's own vertex order."""
        self._prepare(batch, predict=True)
        self.counters.reset()
        t0 = time.perf_counter()
        self._forward(want_grad=False, predict=True)
        n = self._sched.num_rows
        probs = softmax(self.backend, self._arrays[self._slot[self._pushed]][:n],
                        self._params["Wout"], self._params["bout"])
        probs = self.backend.to_numpy(probs)
        self.timings.compute_s += time.perf_counter() - t0
        by_vertex = np.empty_like(probs)
        by_vertex[self._sched.order] = probs
        offsets = batch.forest.offsets
        return [by_vertex[offsets[i]:offsets[i + 1]] for i in range(batch.num_samples)]

    def save(self, path) -> None:
        """Parameters, the optimizer (its type and settings) and its state in one .npz file."""
        to_np = self.backend.to_numpy
        np.savez(path, **{f"param/{k}": to_np(v) for k, v in self._params.items()},
                 **{f"optim/{k}": v for k, v in self.optimizer.state_dict(to_np).items()},
                 optimizer=np.array(json.dumps(self.optimizer.config())))

    @classmethod
    def load(cls, path, model, **engine_options) -> "Engine":
        """An engine for `model` that continues where the saved one stopped: its parameters, and
        its optimizer rebuilt from the saved type and settings with the saved state (pass
        `optimizer=` to use another; its state is then loaded only if it is of the saved type)."""
        with np.load(path, allow_pickle=False) as f:
            saved = {k: f[k] for k in f.files}
        config = json.loads(str(saved.pop("optimizer")))
        if engine_options.get("optimizer") is None:
            engine_options["optimizer"] = optim.from_config(config)
        engine = cls(model, **engine_options)
        params = {k[len("param/"):]: v for k, v in saved.items() if k.startswith("param/")}
        if set(params) != set(engine._params):
            raise ValueError(f"{path}: holds parameters {sorted(params)}, the model has {sorted(engine._params)}")
        for name, value in params.items():
            engine.params[name] = value
        if type(engine.optimizer).__name__ == config["type"]:
            engine.optimizer.load_state_dict(engine.backend, {k[len("optim/"):]: v for k, v in saved.items()
                                                              if k.startswith("optim/")}, engine.dtype)
        return engine

    def _pass(self, batch, train: bool = True) -> float:
        self._prepare(batch)
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
