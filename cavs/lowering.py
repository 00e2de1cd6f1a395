"""Lowering: F and dF, compiled once per engine into storage and per-op closures ("steps").

`Lowered` decides once where every value lives (its own dynamic tensor, its concat's columns, an
affine sum's buffer, a view of its input), which phase each op runs in (analysis.py) and which
elementwise ops fuse (fusion.py). Its step factories, all named `*_step`, turn one op (or fused
group) into a closure `step(a, b, t)` that runs it on rows [a, b) of its own domain -- vertex rows,
or edge rows for per-edge values -- of task t (t = -1 for a whole-batch phase). The closures read
the bound buffers (memory.Buffers) and this batch's message plans at call time, so one closure
serves every batch. Which closures run on which rows of a batch is planning.py's business.
"""
from __future__ import annotations

import time

import numpy as np

from . import fusion, row_kernels, tokens
from .analysis import PHASES, affine_sums, concat_homes, gather_pieces, phases
from .memory import Buffers
from .ops import OPS, Node
from .support import COMPUTE, PASS, ROW_SUBSET_OPS, SKIP, ZERO, row_bounds

# A product bounded by child slot k (support.row_bounds) runs on the rows with child k alone when
# they are at most this share of its rows; above it, copying them out costs more than it saves.
SUBSET_MAX_SHARE = 0.8


class Lowered:
    """The compiled program of one engine: storage, phases, fused items and the step factories."""

    def __init__(self, F, dF, backend, dtype, grads: dict, options: dict, counters, timings):
        self.backend, self.xp, self.dtype = backend, backend.xp, dtype
        self.grads, self.options, self.counters, self.timings = grads, options, counters, timings
        nodes = F.nodes + dF.nodes
        self.slot = {n: i for i, n in enumerate(nodes)}
        fused_cpu = options["fusion"] and backend.name == "numpy"
        # row moves by index as Numba loops over `based` buffers (row_kernels.py), where those exist
        self.row_take = self.row_add = None
        if fused_cpu:
            self.row_take, self.row_add = row_kernels.take_kernel(dtype.name), row_kernels.add_kernel(dtype.name)
        self.consumers: dict[Node, list[Node]] = {}
        for n in nodes:
            for i in n.inputs:
                self.consumers.setdefault(i, []).append(n)
        self.home = concat_homes(nodes, self.consumers if fused_cpu else None)
        # gathers that write pieces of the child's row to their slices' concats (gather_pieces)
        self.pieces = {n: p for n in nodes if n.op == "gather"
                       and (p := gather_pieces(n, self.home, self.consumers)) is not None}
        # concats whose parts all live in their columns: nothing to copy (a zero-fill still runs
        # on tasks where the concat is known zero, as its parts are then skipped)
        self.elided = {n for n in nodes if n.op == "concat"
                       and all(self.home.get(p, (None,))[0] is n for p in n.inputs)}
        # the gradient of a gather whose slices have different sources (d[hl; cl]: dhl a slice of
        # the product's gradient, dcl the cell's): the scatter adds each part from where it is,
        # so the concat that would assemble them is never run (with the row kernels)
        self.scattered_parts = {}
        for n in nodes:
            d = n.inputs[0] if n.op == "scatter_grad_child" else None
            if fused_cpu and d is not None and d.op == "concat" and d not in self.elided \
                    and self.consumers[d] == [n]:
                col, parts = 0, []
                for p in d.inputs:
                    parts.append((col, col + p.shape[0], p))
                    col += p.shape[0]
                self.scattered_parts[n] = parts
                self.elided.add(d)
        # with fusion on, matmul sums are computed in their root's buffer (affine_sums)
        self.affine = {a.root: a for a in affine_sums(nodes, self.consumers)} if options["fusion"] else {}
        self.sum_of = {n: a for a in self.affine.values() for n in a.terms + a.inner}
        # products and parameter gradients that are zero outside the rows with some child k
        self.bound = {n: ks for n, ks in row_bounds(nodes).items() if n.op in ROW_SUBSET_OPS}
        self.state = F.scatter.inputs[0]
        self.pushed = F.push.inputs[0] if F.push is not None else None
        self.dstate = next(n for n in dF.nodes if n.op == "gather_grad_state")
        self.dpush = next((n for n in dF.nodes if n.op == "pull_grad_output"), None)
        self.dpull = next((n.inputs[0] for n in dF.nodes if n.op == "push_grad_input"), None)
        self.pulls = [n for n in F.nodes if n.op == "pull"]
        self.sources = [n for n in nodes if OPS[n.op].kind == "source"]
        self.uses_edges = any(n.on_edges or n.op in ("num_children", "edge_sum", "edge_max") for n in nodes)
        loop_sources = {n for n in F.nodes if n.op in ("gather", "child_state")}
        fwd = phases(F.nodes, loop_sources, {F.scatter})
        bwd = phases(dF.nodes, {self.dstate}, {n for n in dF.nodes if n.op in ("scatter_grad_child",
                                                                              "child_state_grad")})
        self.phase_of = {**fwd, **bwd}
        # an affine sum's first term to run writes, the others accumulate: order them by phase
        where = self.where()
        for a in self.affine.values():
            a.terms.sort(key=lambda t: PHASES.index(where[self.phase_of[t]]))
        self.forward_phases = self._phase_items(F.nodes, fwd)
        self.backward_phases = self._phase_items(dF.nodes, bwd)
        # broadcasts that only fused kernels read (through the parent index): never materialized
        self.read_through = set()
        if fused_cpu:
            fused = {m for g in self.fused_groups() for m in g.nodes}
            self.read_through = {n for n in nodes if n.op == "broadcast" and set(self.consumers.get(n, [])) <= fused}
            for ph in (self.forward_phases, self.backward_phases):
                for p in ph:
                    ph[p] = [it for it in ph[p] if it not in self.read_through]
        stored = [n for n in nodes if n.has_rows and n.op != "slice" and n not in self.home
                  and n not in self.sum_of and n not in self.read_through]
        self.buffers = Buffers(backend, dtype, nodes, self.slot, stored, self.home, self.sum_of, fused_cpu)
        self.arrays, self.based = self.buffers.arrays, self.buffers.based
        self.shared = self._sharing(F, dF)
        self.steps = {}           # (item, action) -> closure
        self.subgroups = {}       # (fused group, its computing members) -> the smaller fused group
        self.task_steps = {}      # loop signature -> steps, shared by tasks alike in what they skip
        self.batch = None         # this batch's schedule and message plans (planning.BatchPlans)

    def where(self) -> dict[str, str]:
        """Where each phase's ops run: switched-off phases fold into the loop."""
        return {"eager": "eager" if self.options["eager"] else "loop", "loop": "loop",
                "lazy": "lazy" if self.options["lazy"] else "loop"}

    def _phase_items(self, nodes, phase_of) -> dict[str, list]:
        """Per phase, its ops in topological order (switched-off phases fold into the loop);
        with fusion on, each fused group of elementwise ops is one item."""
        where = self.where()
        items = {}
        through = self.options["fusion"] and self.backend.name == "numpy"   # the CPU's kernels
        for p in PHASES:
            ops = [n for n in nodes if n in phase_of and where[phase_of[n]] == p]
            fusable = [n for n in ops if n not in self.affine and n not in self.sum_of]
            groups = fusion.bounded(fusion.find_groups(fusable, self.consumers, through), self.consumers,
                                    broadcasts=through) if self.options["fusion"] else []
            items[p] = fusion.contracted_order(ops, groups)
        return items

    def _sharing(self, F, dF):
        """The products computed once per distinct token (tokens.py), or None: where the option
        is off, on the GPU (untested there), with streaming (its eager and lazy chunks would each
        share within themselves only), or where a product is bounded by child slots or an add of
        the embedding's gradient is fused with other ops."""
        if not self.options.get("share_tokens") or self.backend.name != "numpy" or self.options["streaming"]:
            return None
        s = tokens.find(F, dF, self.consumers)
        if s is None:
            return None
        fused = {m for g in self.fused_groups() for m in g.nodes}
        if (s.products | s.weight_grads | s.input_grads) & set(self.bound) or s.elided & fused:
            return None
        return s

    def fused_groups(self) -> list:
        return [it for ph in (self.forward_phases, self.backward_phases) for items in ph.values()
                for it in items if isinstance(it, fusion.FusedGroup)]

    # ------------------------------------------------------------ the steps of one item

    def step(self, item, action):
        """The closure running `item` (a node or a fused group) with `action` (support.py's
        COMPUTE / ZERO / PASS + k, or an affine term's "write" / "accumulate" / "fill")."""
        key = (item, action)
        if key not in self.steps:
            if isinstance(action, str):
                self.steps[key] = self.affine_step(item, action)
            elif isinstance(item, fusion.FusedGroup):
                self.steps[key] = self.fused_step(item)
            elif action >= PASS:
                self.steps[key] = self.pass_step(item, item.inputs[action - PASS])
            else:
                self.steps[key] = self.compute_step(item) if action == COMPUTE else self.zero_step(item)
            if self.shared is not None and item in self.shared.elided:
                self.steps[key] = self.unless_shared(self.steps[key])
        return self.steps[key]

    def item_steps(self, item, action_of, variants: bool = True) -> list:
        """Closures for one item given each member's action: a fused group runs as one kernel
        where all its members compute; where some do, as one smaller kernel of those (compiled
        once per such combination, if `variants`) or member by member."""
        if isinstance(item, fusion.FusedGroup):
            acts = tuple(action_of(m) for m in item.nodes)
            if all(a == COMPUTE for a in acts):
                return [self.step(item, COMPUTE)]
            # e.g. at the leaves, where the forget gates are skipped: zero-fill what must read as
            # zero, then one kernel for the members that compute or pass an input through
            zeros = [self.step(m, ZERO) for m, a in zip(item.nodes, acts) if a == ZERO]
            running = [(m, a) for m, a in zip(item.nodes, acts) if a == COMPUTE or a >= PASS]
            # (a group reading a broadcast through the parent index always runs as a kernel: the
            # broadcast is not materialized for its members to read one by one)
            through = self.backend.name == "numpy" and fusion.reads_broadcast(item)
            if not running or (not through and (sum(a == COMPUTE for _, a in running) < 2 or not variants)):
                return zeros + [self.step(m, a) for m, a in running]
            key = (item, tuple(running))
            if key not in self.subgroups:
                passes = {m: a - PASS for m, a in running if a >= PASS}
                self.subgroups[key] = fusion.describe([m for m, _ in running], self.consumers, passes)
            return zeros + [self.step(self.subgroups[key], COMPUTE)]
        if item in self.affine or item in self.sum_of:
            return self.affine_steps(item, action_of)
        a = action_of(item)
        return [] if a == SKIP or (a == COMPUTE and item in self.elided) else [self.step(item, a)]

    def affine_steps(self, n: Node, action_of) -> list:
        """The closures of an affine sum's node on one task, from the actions of its terms."""
        s = self.affine.get(n) or self.sum_of[n]
        if n in s.inner or action_of(n) == SKIP:
            return []
        computing = [t for t in s.terms if action_of(t) == COMPUTE]
        if n is s.root:
            return [] if computing else [self.step(n, "fill")]
        if n not in computing:
            return []
        return [self.step(n, "accumulate" if computing[0] is not n else "write")]

    # ------------------------------------------------------------ step factories

    def compute_step(self, n: Node):
        """Node n on rows [a, b) of its domain."""
        factory = {"gather": self.gather_step, "scatter_grad_child": self.scatter_grad_step,
                   "child_state": self.child_state_step, "child_state_grad": self.child_state_grad_step,
                   "broadcast": self.broadcast_step, "edge_sum": self.edge_reduce_step,
                   "edge_max": self.edge_reduce_step, "edge_softmax": self.edge_softmax_step,
                   "concat": self.concat_step}.get(n.op)
        if factory is not None:
            return factory(n)
        if self.shared is not None and n in self.shared.products:
            return self.shared_product_step(n, "write", self.op_step(n))
        if self.shared is not None and n in self.shared.weight_grads:
            return self.shared_weight_grad_step(n, self.op_step(n))
        if self.shared is not None and n in self.shared.input_grads:
            return self.shared_input_grad_step(n, self.op_step(n))
        step = self.op_step(n)
        return self.subset_step(n, step) if n in self.bound else step

    def op_step(self, n: Node):
        """Node n by its OPS row's implementation, on rows [a, b) (a reduction: into its gradient)."""
        be, A, kernels = self.backend, self.arrays, self.counters.kernels
        o, op, attrs = self.slot[n], n.op, n.attrs
        run = OPS[op].run
        ins = [(self.slot[i], i.is_param) for i in n.inputs]
        if OPS[op].kind == "reduce":
            grad = self.grads[n.attrs["param"]]

            def reduce_step(a, b, t):
                run(be, grad, [A[s] if p else A[s][a:b] for s, p in ins], attrs)
                kernels[op] += 1
            step = reduce_step
        else:
            def op_step(a, b, t):
                run(be, A[o][a:b], [A[s] if p else A[s][a:b] for s, p in ins], attrs)
                kernels[op] += 1
            step = op_step
        return step

    def rows_with_children(self, n: Node, a: int, b: int, t: int = -1):
        """The rows of [a, b) whose vertex has one of the children that bound n
        (support.row_bounds), as an index array, or None where they are nearly all rows (then
        copying them out costs more than the products it saves). Cached per batch."""
        key = (self.bound[n], a, b)
        rows = self.batch.row_sets.get(key)
        if rows is None and t >= 0 and self.batch.messages is not None and \
                all(self.batch.messages.plans[t][k].mode == "all" for k in key[0]):
            rows = self.batch.row_sets[key] = False      # every row of the task has those children
        if rows is None:
            present = (self.batch.sched.child_rows[a:b, sorted(key[0])] >= 0).any(axis=1)
            count = int(present.sum())
            rows = False if count > SUBSET_MAX_SHARE * (b - a) else self.backend.index(np.flatnonzero(present))
            self.batch.row_sets[key] = rows
        return None if rows is False else rows

    def subset_step(self, n: Node, full_step):
        """A product or parameter gradient whose vertex input is zero on every row without
        certain children (support.row_bounds): where few rows have them, it multiplies those rows
        alone (copied out, and back into the output, whose other rows get zeros); the same
        numbers as `full_step` over all rows, without its multiplications by zero rows."""
        be, A, kernels, xp = self.backend, self.arrays, self.counters.kernels, self.xp
        o, op, attrs = self.slot[n], n.op, n.attrs
        run = OPS[op].run
        ins = [(self.slot[i], i.is_param) for i in n.inputs]
        reduce = OPS[op].kind == "reduce"
        grad = self.grads[n.attrs["param"]] if reduce else None

        def rows_step(a, b, t):
            rows = self.rows_with_children(n, a, b, t)
            if rows is None:
                full_step(a, b, t)
                return
            args = [A[s] if p else A[s][a:b][rows] for s, p in ins]
            if reduce:
                run(be, grad, args, attrs)
            else:
                out = A[o][a:b]
                part = xp.empty((len(rows), out.shape[1]), dtype=out.dtype)
                run(be, part, args, attrs)
                out.fill(0)
                out[rows] = part
            kernels[op + "-rows"] += 1
        return rows_step

    def concat_step(self, n: Node):
        """Copies the parts that are not stored in the concat's columns already (concat_homes)."""
        A, kernels, o = self.arrays, self.counters.kernels, self.slot[n]
        copies, col = [], 0
        for p in n.inputs:
            if self.home.get(p) != (n, col):
                copies.append((self.slot[p], col, col + p.shape[0]))
            col += p.shape[0]

        def concat(a, b, t):
            out = A[o]
            for s, c0, c1 in copies:
                out[a:b, c0:c1] = A[s][a:b]
            kernels["concat"] += 1
        return concat

    def fused_step(self, g: "fusion.FusedGroup"):
        """One generated kernel for a group: reads its inputs' rows, writes its outputs' rows."""
        A, kernels = self.arrays, self.counters.kernels
        ins = [self.slot[i] for i in g.inputs]
        outs = [self.slot[o] for o in g.outputs]
        if self.backend.name == "cupy":
            kernel = fusion.compile_cupy(*fusion.cupy_source(g))
            params = [i.is_param for i in g.inputs]

            def fused_gpu(a, b, t):
                kernel(*[A[s] if p else A[s][a:b] for s, p in zip(ins, params)], *[A[s][a:b] for s in outs])
                kernels["fused"] += 1
            return fused_gpu
        kernel = fusion.compile_numba(fusion.numba_source(g), self.dtype.name)
        based = self.based
        params = {s for i, s in zip(g.inputs, ins) if i.is_param}
        # a broadcast input: its vertex value, read at each edge's parent row (numba_source)
        ins = [self.slot[i.inputs[0]] if i.op == "broadcast" else s for i, s in zip(g.inputs, ins)]
        through = fusion.reads_broadcast(g)

        def fused(a, b, t):
            args = [self.batch.edges.parent] if through else []
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

    def affine_step(self, n: Node, how: str):
        """A term of an affine sum: "write" (the first on this task; adds the bias), or
        "accumulate"; or the root's "fill" where no term computes (the bias, or zeros)."""
        A, be, kernels = self.arrays, self.backend, self.counters.kernels
        s = self.affine.get(n) or self.sum_of[n]
        o, bias = self.slot[s.root], None if s.bias is None else self.slot[s.bias]
        if how == "fill":
            def fill(a, b, t):
                A[o][a:b] = A[bias] if bias is not None else 0
                kernels["bias-fill" if bias is not None else "zero-fill"] += 1
            return fill
        x, w = self.slot[n.inputs[0]], self.slot[n.inputs[1]]
        accumulate = how == "accumulate"
        bounded = n in self.bound

        def term(a, b, t):
            rows = self.rows_with_children(n, a, b, t) if bounded else None
            if rows is None:
                be.gemm(A[o][a:b], A[x][a:b], A[w], accumulate=accumulate,
                        bias=None if accumulate or bias is None else A[bias])
                kernels["matmul"] += 1
                return
            out = A[o][a:b]            # a term that is zero outside `rows` (see subset_step)
            part = self.xp.empty((len(rows), out.shape[1]), dtype=out.dtype)
            be.gemm(part, A[x][a:b][rows], A[w])
            if not accumulate:
                out[...] = A[bias] if bias is not None else 0
            out[rows] += part
            kernels["matmul-rows"] += 1
        if self.shared is not None and n in self.shared.products:
            return self.shared_product_step(n, how, term, s.root, s.bias)
        return term

    def pass_step(self, n: Node, source: Node):
        """An add whose other input is known zero on these rows: a copy of this one."""
        A, o, s, kernels = self.arrays, self.slot[n], self.slot[source], self.counters.kernels

        def copy(a, b, t):
            A[o][a:b] = A[s][a:b]
            kernels["copy"] += 1
        return copy

    def zero_step(self, n: Node):
        A, kernels = self.arrays, self.counters.kernels
        # a gather in pieces: each piece where it lives (its own buffer: only the columns of its
        # slices that are not homed, gather_pieces)
        views = [(self.slot[v], (c0, c1) if v is n else None) for c0, c1, v in self.pieces[n]] \
            if n in self.pieces else [(self.slot[n], None)]

        def zero(a, b, t):
            for s, cols in views:
                (A[s][a:b] if cols is None else A[s][a:b, cols[0]:cols[1]]).fill(0)
            kernels["zero-fill"] += 1
        return zero

    # ------------------------------------------------------------ message steps (memory moves)

    def gather_step(self, n: Node):
        """gather(k): child k's state into the task's rows (zeros where a vertex has no child k);
        a gather in pieces (gather_pieces) writes each piece of the child's row where it lives."""
        A, k, be, counters = self.arrays, n.attrs["k"], self.backend, self.counters
        o, state, row_bytes = self.slot[n], self.slot[self.state], n.shape[0] * self.dtype.itemsize
        take, based = self.row_take, self.based
        # (first column in the state, width, slot of the storage, first column in that value)
        pieces = [(c0, c1 - c0, self.slot[v], c0 if v is n else 0) for c0, c1, v in self.pieces.get(n, [(0, n.shape[0], n)])]

        def gather(a, b, t):
            t0 = time.perf_counter()
            plan = self.batch.messages.plans[t][k]
            if plan.mode == "all" and take is not None:
                src, s0 = based[state]
                for c0, w, s, v0 in pieces:
                    out, o0 = based[s]
                    take(src, s0 + c0, plan.child_rows, out, a, o0 + v0, w)
                moved = b - a
            elif plan.mode == "all":
                be.take_rows(A[state], plan.child_rows, A[o][a:b])
                moved = b - a
            else:
                moved = 0 if plan.mode == "none" else len(plan.child_rows)
                for c0, w, s, v0 in pieces:
                    out = A[s][a:b, v0:v0 + w]
                    out.fill(0)
                    if plan.mode == "some":
                        out[plan.positions] = A[state][plan.child_rows, c0:c0 + w]
            counters.kernels["gather"] += 1
            counters.bytes_moved["gather"] += moved * row_bytes
            self.timings.memory_s += time.perf_counter() - t0
        return gather

    def scatter_grad_step(self, n: Node):
        """The dual of gather(k): the rows' gradients added into child k's state gradient; the
        gradient of a gather in parts (scattered_parts) is added part by part from where each is."""
        A, k, be, counters = self.arrays, n.attrs["k"], self.backend, self.counters
        dy, dstate, row_bytes = self.slot[n.inputs[0]], self.slot[self.dstate], n.shape[0] * self.dtype.itemsize
        add, based = self.row_add, self.based
        # (first column in the state, width, slot of the part)
        parts = [(c0, c1 - c0, self.slot[p]) for c0, c1, p in self.scattered_parts.get(n, [(0, n.shape[0], n.inputs[0])])]

        def scatter_grad(a, b, t):
            plan = self.batch.messages.plans[t][k]
            if plan.mode == "none":
                return
            t0 = time.perf_counter()
            if add is not None:
                dst, d0 = based[dstate]
                for c0, w, s in parts:
                    if plan.mode == "all":
                        add(dst, d0 + c0, plan.child_rows, based[s][0], a, based[s][1], w)
                    else:                  # the rows with child k, copied out (C-contiguous)
                        add(dst, d0 + c0, plan.child_rows, A[s][a:b][plan.positions], 0, 0, w)
                moved = len(plan.child_rows)
            else:                          # no row kernels: no parts (scattered_parts)
                g = A[dy][a:b]
                if plan.mode == "some":
                    g = g[plan.positions]
                be.add_rows(A[dstate], plan.child_rows, g, plan.unique)
                moved = len(g)
            counters.kernels["scatter"] += 1
            counters.bytes_moved["scatter"] += moved * row_bytes
            self.timings.memory_s += time.perf_counter() - t0
        return scatter_grad

    def child_state_step(self, n: Node):
        """children().state: every edge's child state, one indexed copy for the task's edges."""
        A, be, counters = self.arrays, self.backend, self.counters
        o, state, row_bytes = self.slot[n], self.slot[self.state], n.shape[0] * self.dtype.itemsize
        take, based, width = self.row_take, self.based, n.shape[0]

        def child_state(a, b, t):
            if b <= a:
                return
            t0 = time.perf_counter()
            if take is not None:
                take(*based[state], self.batch.edges.child[a:b], based[o][0], a, based[o][1], width)
            else:
                be.take_rows(A[state], self.batch.edges.child[a:b], A[o][a:b])
            counters.kernels["gather"] += 1
            counters.bytes_moved["gather"] += (b - a) * row_bytes
            self.timings.memory_s += time.perf_counter() - t0
        return child_state

    def child_state_grad_step(self, n: Node):
        """The dual of children().state: each edge's gradient added into its child's d(state)."""
        A, be, counters = self.arrays, self.backend, self.counters
        dy, dstate, row_bytes = self.slot[n.inputs[0]], self.slot[self.dstate], n.shape[0] * self.dtype.itemsize
        add, based, width = self.row_add, self.based, n.shape[0]

        def child_state_grad(a, b, t):
            if b <= a:
                return
            t0 = time.perf_counter()
            if add is not None:
                add(*based[dstate], self.batch.edges.child[a:b], based[dy][0], a, based[dy][1], width)
            else:
                be.add_rows(A[dstate], self.batch.edges.child[a:b], A[dy][a:b], self.batch.edges.unique)
            counters.kernels["scatter"] += 1
            counters.bytes_moved["scatter"] += (b - a) * row_bytes
            self.timings.memory_s += time.perf_counter() - t0
        return child_state_grad

    def broadcast_step(self, n: Node):
        """kids.broadcast(x): each edge's row is its parent's row of x (edge rows [a, b))."""
        A, be, kernels = self.arrays, self.backend, self.counters.kernels
        o, x = self.slot[n], self.slot[n.inputs[0]]

        def broadcast(a, b, t):
            if b > a:
                be.take_rows(A[x], self.batch.edges.parent[a:b], A[o][a:b])
            kernels["broadcast"] += 1
        return broadcast

    def edge_reduce_step(self, n: Node):
        """e.sum() / e.max(): each vertex row of [a, b) from its edges (zeros where it has none),
        as a segment reduction over the edges, which are sorted by parent."""
        A, be, kernels, op = self.arrays, self.backend, self.counters.kernels, n.op
        o, x = self.slot[n], self.slot[n.inputs[0]]
        how = "sum" if op == "edge_sum" else "max"

        def edge_reduce(a, b, t):
            be.segment_rows(how, A[o], A[x], self.batch.edges, a, b)
            kernels[op] += 1
        return edge_reduce

    def edge_softmax_step(self, n: Node):
        """kids.softmax(s): exp(s - max) / sum over each parent's edges (edge rows [a, b))."""
        A, be, xp, kernels = self.arrays, self.backend, self.xp, self.counters.kernels
        o, x = self.slot[n], self.slot[n.inputs[0]]

        def edge_softmax(a, b, t):
            if b <= a:
                kernels["edge_softmax"] += 1
                return
            edges = self.batch.edges
            parent = edges.parent[a:b]
            lo = int(edges.parent_host[a])          # the parents of these edges: rows [lo, hi)
            hi = int(edges.parent_host[b - 1]) + 1
            local = parent - lo
            s, out = A[x][a:b], A[o][a:b]
            peak = xp.zeros((hi - lo, s.shape[1]), dtype=s.dtype)
            be.max_rows(peak, local, s)
            be.take_rows(peak, local, out)
            xp.subtract(s, out, out=out)
            xp.exp(out, out=out)
            total = xp.zeros_like(peak)
            be.add_rows(total, local, out)
            xp.divide(out, total[local], out=out)
            kernels["edge_softmax"] += 1
        return edge_softmax

    # ------------------------------------------------------------ token sharing (tokens.py)

    def unless_shared(self, regular):
        """An add of the embedding's gradient: nothing to do where the batch shares tokens (the
        input gradients then accumulate into the embedding's gradient themselves)."""
        def add_unless_shared(a, b, t):
            if self.batch.tokens is None:
                regular(a, b, t)
        return add_unless_shared

    def shared_product_step(self, n: Node, how: str, regular, root: Node | None = None, bias: Node | None = None):
        """x @ W on rows [a, b) as E[u] @ W for the range's distinct tokens u, each row then given
        its token's row: written ("write": the bias, or zeros, on rows without a word) or added
        ("accumulate") into the output (an affine sum's root, or the product's own rows)."""
        A, be, xp, kernels = self.arrays, self.backend, self.xp, self.counters.kernels
        o = self.slot[root if root is not None else n]
        w, bias = self.slot[n.inputs[1]], None if bias is None else self.slot[bias]
        accumulate = how == "accumulate"

        def shared_product(a, b, t):
            tok = self.batch.tokens
            if tok is None:
                regular(a, b, t)
                return
            r = tok.range(a, b)
            out = A[o][a:b]
            if not accumulate and not r.dense:
                out[...] = 0 if bias is None else A[bias]
            if r.count:
                x = tok.inputs(r, a, b)
                p = xp.empty((r.distinct, out.shape[1]), dtype=out.dtype)
                with_bias = not accumulate and bias is not None and r.dense
                be.gemm(p, x, A[w], bias=A[bias] if with_bias else None)
                if r.dense and not accumulate:
                    be.take_rows(p, r.slot, out)
                elif r.dense:
                    out += p[r.slot]
                else:
                    out[r.rows] += p[r.slot]
            kernels["matmul"] += 1
        return shared_product

    def shared_weight_grad_step(self, n: Node, regular):
        """dW += x^T dy on rows [a, b) as E[u]^T dy_u, with dy summed per distinct token."""
        A, be, kernels = self.arrays, self.backend, self.counters.kernels
        grad, dy = self.grads[n.attrs["param"]], self.slot[n.inputs[1]]

        def shared_weight_grad(a, b, t):
            tok = self.batch.tokens
            if tok is None:
                regular(a, b, t)
                return
            r = tok.range(a, b)
            if r.count:
                summed = tok.summed(A[dy][a:b], (dy, a, b), r)
                be.gemm(grad, tok.inputs(r, a, b).T, summed, accumulate=True)
            kernels["param_grad"] += 1
        return shared_weight_grad

    def shared_input_grad_step(self, n: Node, regular):
        """dy @ W^T on rows [a, b), a term of the pull's gradient: dy_u @ W^T for the range's
        distinct tokens, added into the embedding's gradient rows (one per distinct token)."""
        A, be, xp, kernels = self.arrays, self.backend, self.xp, self.counters.kernels
        dy, w = self.slot[n.inputs[0]], self.slot[n.inputs[1]]

        def shared_input_grad(a, b, t):
            tok = self.batch.tokens
            if tok is None:
                regular(a, b, t)
                return
            r = tok.range(a, b)
            if r.count:
                summed = tok.summed(A[dy][a:b], (dy, a, b), r)
                if r.whole:
                    be.gemm(tok.grad, summed, A[w].T, accumulate=True)
                else:
                    part = xp.empty((r.distinct, tok.grad.shape[1]), dtype=tok.grad.dtype)
                    be.gemm(part, summed, A[w].T)
                    tok.grad[r.global_slot] += part
            kernels["matmul_t"] += 1
        return shared_input_grad
