"""DyNet with autobatching (Neubig et al. 2017): the paper's main dynamic-declaration baseline.

Written the way DyNet's own examples (treelstm, rnnlm) are: one computation graph per batch
(`dy.renew_cg()`), per-sample expressions built vertex by vertex, the mean (`dy.esum` / count) of
the per-vertex losses, `loss.backward()`, `trainer.update()` (SimpleSGD, gradient clipping on).
Autobatching finds the batches at forward time.

Autobatch strategy (option `autobatch`): 1 = agenda-based (DyNet's default), 2 = depth-based.
DyNet reads `dynet_config` once, at its first import, so this module configures and imports
DyNet lazily in the first constructor. The strategy itself is the C++ global
`dynet::autobatch_flag`, read again at every forward; a later system in the same process that
asks for the other strategy gets it by writing that global (ctypes) before each of its forwards.
Benchmark cells each run in their own process, where that write never happens.

Timings.memory_s stays None. DyNet's profiler (dynet_config profiling=1) prints time per node
type, cumulated, only at process exit; and the autobatcher's memory movement (the input copies of
BatchedExecutionEngine::combine_tensors, the gradient scatter of accumulate_tensors) runs inside
the timer of the op that consumes it, so no number DyNet reports isolates memory movement.
DyNet runs float32 only and its CPU kernels on one thread.

The Adagrad option (base.Adagrad, SST training to accuracy): dy.AdagradTrainer, with the L2 term put
into the graph, (wd/2) ||p||^2 for the dense parameters and for each embedding row the batch looks
up (DyNet's own weight_decay is a global multiplicative decay of all weights, a different rule).
DyNet's trainer updates only the looked-up rows of a lookup parameter (sparse updates, its
default) and divides by sqrt(acc + eps) rather than sqrt(acc) + eps; eps^2 in its place makes that
the same to within float32 rounding except for gradients below ~eps. Gradient clipping (DyNet's
default: norm 5) is switched off, as in the other systems (Tai et al. use none).
"""
from __future__ import annotations

import ctypes
import os
import sys
from functools import cached_property

import numpy as np

from cavs import workloads
from cavs.graphs import InputError, make_forest

from .base import System, root_of

STRATEGIES = {1: "agenda", 2: "depth"}
_state = {}   # the process's DyNet: "dy" (module), "flag" (ctypes view of autobatch_flag)


def pool_mb(workload: str, hidden: int, batch_size: int, leaves: int) -> int:
    """DyNet's memory pools for one batch: autobatching cannot grow them, and reserving (touching)
    far more than needed costs seconds per process (8 GB: 20 s), so size them from the batch:
    vertices x floats per vertex (gates, states, logits; forward and backward), with margin."""
    vertices = {"fixed_lstm": 64, "var_lstm": 84, "tree_fc": 2 * leaves, "tree_lstm": 120}[workload] * batch_size
    classes = 10_000 if workload.endswith("lstm") and workload != "tree_lstm" else 5
    floats = 24 * hidden + 3 * classes + 300
    return int(min(16_000, max(1024, 4 * 4 * vertices * floats / 2**20 + 512)))


def _dynet(autobatch: int, seed: int, mem_mb: int):
    """Imports DyNet configured for autobatching (once per process); returns the module."""
    if "dy" not in _state:
        import dynet_config
        if "dynet" not in sys.modules and dynet_config.get() is None:
            # the seed only affects DyNet's own initializers, which set_params overwrites
            # autobatching cannot grow DyNet's memory pools on the fly: reserve them up front
            dynet_config.set(autobatch=autobatch, random_seed=seed,
                             mem=os.environ.get("CAVS_DYNET_MEM", str(mem_mb)))
        import dynet
        conf = dynet_config.get() or {}
        if not conf.get("autobatch"):
            raise RuntimeError("dynet was imported without autobatching before baselines.dynet_autobatch; "
                               "import this module first or call dynet_config.set(autobatch=1) before "
                               "`import dynet`")
        with open("/proc/self/maps") as maps:   # the libdynet this process has loaded
            libs = sorted({line.split()[-1] for line in maps if "libdynet" in line})
        if len(libs) != 1:
            raise RuntimeError(f"expected one loaded libdynet to select the autobatch strategy, found {libs}")
        flag = ctypes.c_int.in_dll(ctypes.CDLL(libs[0]), "_ZN5dynet14autobatch_flagE")
        if flag.value != int(conf["autobatch"]):   # guards against having opened a different copy
            raise RuntimeError(f"{libs[0]} reports autobatch {flag.value}, dynet_config says {conf['autobatch']}")
        _state.update(dy=dynet, flag=flag)
    return _state["dy"]


class DynetSystem(System):
    """A paper workload in DyNet. What depends on the workload (memory_mb, param_shapes,
    initial_params, states) is a method of its own, so that another model (dynet_child_sum.py)
    keeps the rest: DyNet's set-up, the parameter interface, the training step, predict."""
    name = "dynet"
    blas = "eigen (dynet)"
    supports_float64 = False
    takes_adagrad = True

    def __init__(self, workload, *, autobatch: int = 1, **kwargs):
        super().__init__(workload, **kwargs)
        if autobatch not in STRATEGIES:
            raise ValueError(f"autobatch must be one of {sorted(STRATEGIES)} "
                             f"({', '.join(f'{k}={v}' for k, v in STRATEGIES.items())}), got {autobatch!r}")
        if self.dtype != "float32":
            raise ValueError(f"DyNet computes in float32 only, got dtype {self.dtype!r}")
        self.autobatch = autobatch
        self.dy = dy = _dynet(autobatch, self.seed, self.memory_mb())
        self.shapes = self.param_shapes()
        self.model = dy.ParameterCollection()
        # DyNet is column-major and multiplies column vectors, so our row-convention `x W`
        # becomes `W^T x`: every matrix but the embedding table is stored transposed.
        self.params = {}
        for name, shape in self.shapes.items():
            if name == "emb":
                self.params[name] = self.model.add_lookup_parameters(shape, name=name)
            else:
                self.params[name] = self.model.add_parameters(shape[::-1], name=name)
        rule = self.optimizer
        if rule is None:
            self.trainer = dy.SimpleSGDTrainer(self.model, learning_rate=workloads.LEARNING_RATE)
            # docs/workloads.md's clipping: DyNet's Trainer::clip_gradients scales every gradient by
            # clip_threshold / ||g|| when the global L2 norm ||g|| of all parameters (lookup tables: the
            # rows with a gradient, repeated lookups summed into their row) exceeds the threshold; torch's
            # clip_grad_norm_ divides by ||g|| + 1e-6, a relative difference below 1e-6. SimpleSGD then
            # updates only those lookup rows, as the other systems do. (Weight decay is 0 unless set with
            # dynet_config, and update() is never rescaled.)
            self.trainer.set_clip_threshold(workloads.CLIP_NORM)
        else:
            self.trainer = dy.AdagradTrainer(self.model, learning_rate=rule.lr, eps=rule.eps * rule.eps)
            self.trainer.set_clip_threshold(0)       # no gradient clipping (DyNet's default clips at 5)
            self.trainer.set_sparse_updates(True)    # only looked-up embedding rows (DyNet's default)
        self._cells = {"fixed_lstm": self._lstm, "var_lstm": self._lstm,
                       "tree_fc": self._tree_fc, "tree_lstm": self._tree_lstm}
        self.timings.extra.update(threads=1, autobatch=STRATEGIES[autobatch])
        self.set_params(self.initial_params())

    # ------------------------------------------------------------ the workload's

    @cached_property
    def sizes(self):
        return workloads.sizes(self.workload, self.hidden, self.leaves, self.embed)

    def memory_mb(self) -> int:
        """DyNet's memory pools, reserved at its import (see pool_mb)."""
        return pool_mb(self.workload, self.hidden, self.batch_size, self.leaves)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        return workloads.param_shapes(self.workload, self.sizes)

    def initial_params(self) -> dict[str, np.ndarray]:
        return workloads.init_params(self.workload, self.hidden, self.seed, "float32", self.leaves, self.embed)

    def states(self, g, order, p) -> list:
        """The h expression of every vertex of graph g (`order`: its vertices, children first)."""
        return self._cells[self.workload](g, order, p)

    # ------------------------------------------------------------ parameters

    # The chain cell uses DyNet's fused LSTM nodes, whose vanilla_lstm_gates adds 1 to the forget
    # gate's pre-activation (VanillaLSTMBuilder's forget bias): DyNet holds b - 1 in the forget
    # columns, and the parameter interface adds the 1 back.
    def _forget_shift(self, name):
        if name == "b" and self.workload in ("fixed_lstm", "var_lstm"):
            return workloads.forget_gate_columns(self.workload, self.hidden)
        return None

    def set_params(self, params):
        for name, p in self.params.items():
            value = np.asarray(params[name], dtype=np.float32)
            if value.shape != self.shapes[name]:
                raise ValueError(f"parameter {name}: shape {value.shape}, expected {self.shapes[name]}")
            if name == "emb":
                p.init_from_array(value)
            else:
                if self._forget_shift(name) is not None:
                    value = value.copy()
                    value[self._forget_shift(name)] -= 1.0
                p.set_value(np.ascontiguousarray(value.T))

    def get_params(self):
        out = {}
        for name, p in self.params.items():
            value = (p.as_array() if name == "emb" else p.as_array().T).astype(np.float32)
            if self._forget_shift(name) is not None:
                value[self._forget_shift(name)] += 1.0
            out[name] = value
        return out

    # ------------------------------------------------------------ batches

    def prepare(self, samples):
        """Reads the samples' input graphs, checked as the engine checks them (acyclicity once over
        the batch, whose levels come with it), and orders each graph's vertices children-first."""
        with self.timings.timing("construct_s"):
            if not samples:
                raise InputError("empty batch: no samples were given")
            graphs = workloads.to_graphs(self.workload, samples)
            forest = make_forest(graphs, self.sizes.arity)
            levels = np.split(forest.level, forest.offsets[1:-1])
            batch = [(g, np.argsort(level, kind="stable")) for g, level in zip(graphs, levels)]
        return batch

    def _new_graph(self, trainable: bool) -> dict:
        """A fresh computation graph under this system's autobatch strategy, and the parameters in
        it: trainable nodes (expr(True)) or constants; the embedding table is looked up row by row."""
        flag = _state["flag"]
        if flag.value != self.autobatch:
            flag.value = self.autobatch
        self.dy.renew_cg()
        return {name: (q if name == "emb" else q.expr(trainable)) for name, q in self.params.items()}

    def step(self, batch) -> float:
        dy = self.dy
        with self.timings.timing("construct_s"):
            p = self._new_graph(trainable=True)
            losses = [loss for g, order in batch for loss in self._losses(g, self.states(g, order, p), p)]
            if not losses:
                raise InputError("no vertex in the batch carries a label, so there is no loss")
            loss = dy.esum(losses) * (1.0 / len(losses))   # the mean over the batch's loss terms
            objective = loss
            if self.optimizer is not None and self.optimizer.weight_decay:
                objective = loss + self._l2_term(batch, p)
        with self.timings.timing("compute_s"):
            value = objective.value()       # forward: autobatching happens here
            if objective is not loss:
                value = loss.value()        # the data loss alone, computed with the objective
            if self.mode == "train":
                objective.backward()
                self.trainer.update()
        self.timings.samples += len(batch)
        self.timings.steps += 1
        return float(value)

    def _l2_term(self, batch, p):
        """(weight_decay / 2) ||p||^2 over the dense parameters and the embedding rows the batch
        looks up: its gradient is Adagrad's L2 term, on those rows only."""
        dy = self.dy
        words = sorted({int(t) for g, _ in batch for t in g.tokens if t >= 0})
        l2 = [dy.squared_norm(p[name]) for name in self.params if name != "emb"]
        l2.append(dy.sum_batches(dy.squared_norm(dy.lookup_batch(self.params["emb"], words))))
        return dy.esum(l2) * (0.5 * self.optimizer.weight_decay)

    def predict(self, batch) -> np.ndarray:
        dy = self.dy
        p = self._new_graph(trainable=False)
        roots = [dy.softmax(dy.affine_transform([p["bout"], p["Wout"], self.states(g, order, p)[root_of(g)]]))
                 for g, order in batch]
        return np.asarray(dy.concatenate_cols(roots).npvalue(), dtype=np.float64).reshape(-1, len(roots)).T

    # ------------------------------------------------------------ vertex functions
    # Each returns the h expressions of one graph's vertices. As a DyNet user would write
    # them, a vertex skips the products with absent inputs (zeros in docs/workloads.md): leaves
    # compute only the x path, internal vertices only the children's path.

    def _losses(self, g, hs, p):
        dy = self.dy
        return [dy.pickneglogsoftmax(dy.affine_transform([p["bout"], p["Wout"], hs[v]]), int(label))
                for v, label in enumerate(g.labels) if label >= 0]

    def _lstm(self, g, order, p):
        """DyNet's fused LSTM nodes (gates i, f, o, g as ours; see _forget_shift), three nodes a
        step. The first step's state is zero: it computes i, o, u from x Wx + b alone, c = i * u."""
        dy, h = self.dy, self.hidden
        hs, cs = [None] * g.num_vertices, [None] * g.num_vertices
        for v in order:
            x, child = p["emb"][int(g.tokens[v])], g.children[v, 0]
            if child >= 0:
                gates = dy.vanilla_lstm_gates(x, hs[child], p["Wx"], p["Wh"], p["b"])
                c = dy.vanilla_lstm_c(cs[child], gates)
                hs[v], cs[v] = dy.vanilla_lstm_h(c, gates), c
            else:
                pre = dy.affine_transform([p["b"], p["Wx"], x])
                c = dy.cmult(dy.logistic(dy.pick_range(pre, 0, h)), dy.tanh(dy.pick_range(pre, 3 * h, 4 * h)))
                hs[v], cs[v] = dy.cmult(dy.logistic(dy.pick_range(pre, 2 * h, 3 * h)), dy.tanh(c)), c
        return hs

    def _children(self, g, v, hs):
        """[h_left; h_right] with zeros for an absent child, or None on a leaf."""
        kids = g.children[v]
        if (kids < 0).all():
            return None
        return self.dy.concatenate([hs[k] if k >= 0 else self.dy.zeros(self.hidden) for k in kids])

    def _tree_fc(self, g, order, p):
        dy = self.dy
        hs = [None] * g.num_vertices
        for v in order:
            kids, tok = self._children(g, v, hs), g.tokens[v]
            pre = dy.affine_transform([p["b"], p["W"], kids]) if kids is not None else p["b"]
            hs[v] = dy.tanh(pre + p["emb"][int(tok)] if tok >= 0 else pre)
        return hs

    def _tree_lstm(self, g, order, p):
        dy, h = self.dy, self.hidden
        hs, cs = [None] * g.num_vertices, [None] * g.num_vertices
        for v in order:
            kids, tok = self._children(g, v, hs), g.tokens[v]
            pre = [p["b"]]
            if tok >= 0:
                pre += [p["Wx"], p["emb"][int(tok)]]
            if kids is not None:
                pre += [p["Uh"], kids]
            gates = dy.affine_transform(pre)            # i, fl, fr, o, u
            sig = dy.logistic(dy.pick_range(gates, 0, 4 * h))
            terms = [dy.cmult(dy.pick_range(sig, 0, h), dy.tanh(dy.pick_range(gates, 4 * h, 5 * h)))]
            terms += [dy.cmult(dy.pick_range(sig, (k + 1) * h, (k + 2) * h), cs[child])
                      for k, child in enumerate(g.children[v]) if child >= 0]
            c = dy.esum(terms) if len(terms) > 1 else terms[0]
            hs[v], cs[v] = dy.cmult(dy.pick_range(sig, 3 * h, 4 * h), dy.tanh(c)), c
        return hs
