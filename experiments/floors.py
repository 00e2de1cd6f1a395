"""The least time a workload's training can take on this machine, set beside the studies' times
(experiments/studies/bench.py, nary.py; targets.py reads them back).

A workload's training needs certain matrix products: for every product x W of the forward pass
(on the rows that have x), the input gradient dy W^T where x needs one, and the weight gradient
x^T dy; and the same for the output layer. `Product`s list them (`workload_products`,
`child_sum_products`). Each product shape is timed with every installed GEMM library -- NumPy's
OpenBLAS with its own CPU detection, MKL and oneDNN (through PyTorch), oneDNN's own library
(dnnl_sgemm) and TensorFlow's matmul --
in fresh processes pinned to the cells' thread count (`python -m experiments.floors time SPEC`,
through launch.run, with the native OpenBLAS kernels every benchmark cell gets; at two threads
every library runs both), and the fastest library's time counts:

- the floor: every product over all its rows at once, at the fastest library's rate on its shape;
- the frontier bound: the same, but the loop's state products timed per task on the task's own
  rows, forward and input gradient, as any frontier-by-frontier system must run them
  (`frontier_products`): each task streams the whole weight matrix through the cache.

`matmul_rates()` gives each library's rate on one large product, and `fma_peak()` the core's
float32 FMA peak from its vector width and its clock (read from the time of a dependent chain of
fused multiply-adds, whose latency is 4 cycles on x86-64 cores since Haswell and Zen), so that a
study can say how much of the hardware the best library reaches.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

from . import environment, launch

LIBRARIES = ("openblas", "mkl", "onednn", "dnnl", "dnnl-t", "tensorflow")
GATES = {"tree_lstm": 5, "var_lstm": 4, "fixed_lstm": 4, "tree_fc": 1}   # matmul width / hidden
MAX_TIMED_ROWS = 4096        # a longer product is timed at this many rows and scaled (GEMM time is linear there)
LARGE = (2048, 1024, 2560)   # the shape of matmul_rates' product
FMA_LATENCY_CYCLES = 4       # a dependent FMA's latency on x86-64 (Haswell, Skylake, Zen 1-5)
FMA_PIPES = 2                # FMA units per core (the same cores)
LANES = {"avx512f": 16, "amx": 16, "avx2": 8, "avx": 8, "sse4.2": 4, "neon": 4, "sve": 4, "sve2": 4}
# cores that decode an ISA's widest vectors but execute them on narrower FMA pipes: AMD's Zen 4
# (family 25 with AVX-512) splits each 512-bit FMA over its two 256-bit pipes, so it does 8 float32
# lanes per pipe per cycle, not 16 (Zen 5, family 26, has full-width pipes)
NARROW_PIPES = {("AuthenticAMD", "25", "avx512f"): 8}


@dataclass(frozen=True)
class Product:
    """One GEMM: "nn" out (rows x outer) = x (rows x inner) W; "nt" out = dy (rows x inner) W^T
    (W is outer x inner); "tn" out (inner x outer) += x^T dy summed over `rows`."""
    layout: str
    rows: int
    inner: int
    outer: int

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.inner * self.outer

    def timed(self) -> "Product":
        """The shape that is timed: at most MAX_TIMED_ROWS rows."""
        return Product(self.layout, min(self.rows, MAX_TIMED_ROWS), self.inner, self.outer)


def trained(rows: int, inner: int, outer: int, input_grad: bool = True) -> list[Product]:
    """A forward product x W on `rows` rows and what training adds: dy W^T (if x needs a
    gradient) and x^T dy."""
    if rows <= 0:
        return []
    return [Product("nn", rows, inner, outer), Product("tn", rows, inner, outer)] + \
        ([Product("nt", rows, outer, inner)] if input_grad else [])


# ---------------------------------------------------------------- the products a workload needs

def state_in_width(workload: str, hidden: int) -> int:
    """Width of the state a vertex multiplies by its recurrent weight (both children's h on trees)."""
    return {"tree_lstm": 2, "tree_fc": 2}.get(workload, 1) * hidden


def _counts(graphs):
    with_input = sum(int((g.tokens >= 0).sum()) for g in graphs)
    with_children = sum(int((g.children >= 0).any(axis=1).sum()) for g in graphs)
    edges = sum(int((g.children >= 0).sum()) for g in graphs)
    labelled = sum(int((g.labels >= 0).sum()) for g in graphs)
    return with_input, with_children, edges, labelled


def distinct_words(graphs, batch_size: int, where=None) -> int:
    """The rows of a product of the word embedding: the distinct tokens of each batch of
    `batch_size` graphs (at the vertices `where(graph)` selects, default all with a word). The
    engine computes x @ W once per distinct word of a batch (cavs/tokens.py), so a floor that
    counted every word would not bound it."""
    total = 0
    for i in range(0, len(graphs), batch_size):
        tokens = [g.tokens[(g.tokens >= 0) & (True if where is None else where(g))] for g in graphs[i:i + batch_size]]
        total += len(set(int(t) for ts in tokens for t in ts))
    return total


def workload_products(workload: str, hidden: int, samples: list, batch_size: int = 64) -> list[Product]:
    """The products a paper workload's training needs on `samples`, each on the rows that have its
    input: the input projection at the distinct tokens of each batch (distinct_words), the state
    product at vertices with children, the output layer at labelled vertices."""
    import cavs
    s = cavs.workloads.sizes(workload, hidden)
    graphs = [cavs.workloads.to_graph(workload, x, i) for i, x in enumerate(samples)]
    _, with_children, _, labelled = _counts(graphs)
    gates, state_in = GATES[workload], state_in_width(workload, hidden)
    out = trained(with_children, state_in, gates * hidden)
    if workload != "tree_fc":                  # Tree-FC adds its embedding row, no product
        out += trained(distinct_words(graphs, batch_size), s.embed, gates * hidden)
    return out + trained(labelled, hidden, s.classes)


def child_sum_products(trees, hidden: int, embed: int, classes: int, batch_size: int = 64) -> list[Product]:
    """The child-sum Tree-LSTM's products: x W (3H gates) at each batch's distinct words, x Wf (the
    forget gates' share of the vertex's word, which only its edges read) at the distinct words of
    vertices with children, h_sum U at vertices with children, h_k Uf once per edge, the output
    layer at labelled ones. (In SST's n-ary trees the words are on the leaves, so x Wf is needed
    nowhere: a floor that counted it at every word was 12% too high at h = 256, E = 128.)"""
    _, inner, edges, labelled = _counts(trees)
    words = distinct_words(trees, batch_size)
    both = distinct_words(trees, batch_size, lambda g: (g.children >= 0).any(axis=1))
    H, E = hidden, embed
    return trained(words, E, 3 * H) + trained(both, E, H) + trained(inner, H, 3 * H) + \
        trained(edges, H, H) + trained(labelled, H, classes)


def frontier_rows(workload: str, hidden: int, samples: list, batch_size: int = 64) -> list[int]:
    """Per loop task of the batched schedule (all batches in order), its rows with children:
    the rows of that task's state matmul."""
    import cavs
    model = cavs.models.build(workload, hidden=hidden)
    rows = []
    for i in range(0, len(samples), batch_size):
        sched = model.make_batch(samples[i:i + batch_size]).schedule("batched")
        with_children = (sched.child_rows >= 0).any(axis=1)
        rows += [int(with_children[a:b].sum()) for a, b in sched.tasks()]
    return [r for r in rows if r]


def frontier_products(workload: str, hidden: int, samples: list, batch_size: int = 64) -> list[Product]:
    """The loop's state products, task by task: forward x U and input gradient dy U^T on each task's
    rows with children (the weight gradient is batched over all rows after the loop)."""
    k, n = state_in_width(workload, hidden), GATES[workload] * hidden
    rows = frontier_rows(workload, hidden, samples, batch_size)
    return [p for r in rows for p in (Product("nn", r, k, n), Product("nt", r, n, k))]


def child_sum_frontier(trees, hidden: int, batch_size: int) -> list[Product]:
    """The child-sum model's loop products per task: h_sum U on its rows with children, h_k Uf on
    its edges, and their input gradients."""
    from cavs.graphs import make_forest
    from cavs.scheduler import schedule
    out = []
    for i in range(0, len(trees), batch_size):
        sched = schedule(make_forest(trees[i:i + batch_size], None), "batched")
        with_children = sched.degree > 0
        for t, (a, b) in enumerate(sched.tasks()):
            r, e = int(with_children[a:b].sum()), int(sched.edge_bounds[t + 1] - sched.edge_bounds[t])
            out += [Product("nn", r, hidden, 3 * hidden), Product("nt", r, 3 * hidden, hidden)] if r else []
            out += [Product("nn", e, hidden, hidden), Product("nt", e, hidden, hidden)] if e else []
    return out


def state_products(products: list[Product], workload: str, hidden: int) -> list[Product]:
    """Of a workload's products, the forward and input-gradient ones of its state product (the
    loop's, which frontier_products times per task)."""
    k, n = state_in_width(workload, hidden), GATES[workload] * hidden
    return [p for p in products if (p.layout, p.inner, p.outer) in (("nn", k, n), ("nt", n, k))]


# ---------------------------------------------------------------- timed in their own processes

def _fastest_of(product, times: int = 5) -> float:
    """Seconds of the fastest of `times` calls (each repeated to 2 ms at least), after one untimed."""
    product()
    best, reps = float("inf"), 1
    for _ in range(times):
        t0 = time.perf_counter()
        for _ in range(reps):
            product()
        best = min(best, (time.perf_counter() - t0) / reps)
        reps = max(reps, int(0.002 / max(best, 1e-9)))
    return best


def _tensorflow_product(p: Product):
    import numpy as np
    import tensorflow as tf
    rng = np.random.default_rng(0)
    if p.layout == "tn":
        a = tf.constant(rng.uniform(-1, 1, (p.rows, p.inner)).astype(np.float32))
        b = tf.constant(rng.uniform(-1, 1, (p.rows, p.outer)).astype(np.float32))
        return lambda: tf.linalg.matmul(a, b, transpose_a=True)
    a = tf.constant(rng.uniform(-1, 1, (p.rows, p.inner)).astype(np.float32))
    if p.layout == "nt":
        w = tf.constant(rng.uniform(-1, 1, (p.outer, p.inner)).astype(np.float32))
        return lambda: tf.linalg.matmul(a, w, transpose_b=True)
    w = tf.constant(rng.uniform(-1, 1, (p.inner, p.outer)).astype(np.float32))
    return lambda: tf.linalg.matmul(a, w)


def _time_products(library: str, products: list, threads: int = 1) -> dict:
    """Seconds of each product (as a list [layout, rows, inner, outer]) with `library` at `threads`."""
    shapes = [Product(*p) for p in products]
    if library == "tensorflow":
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        seconds = [_fastest_of(_tensorflow_product(p)) for p in shapes]
    else:
        import numpy as np
        from cavs import blas
        if library not in blas.available("float32"):
            return {"status": f"failed: {library} is not usable here"}
        blas.set_pool_threads(None, threads)       # every library's pool at `threads`
        timed = blas.measure([(p.layout, p.rows, p.inner, p.outer) for p in shapes], np.float32, [library])
        # (None: a layout the library does not run, oneDNN's packed weights for x^T dy)
        seconds = [timed[(p.layout, p.rows, p.inner, p.outer)].get(library) for p in shapes]
    return {"seconds": seconds, "kernels": _openblas_kernels(), "status": "ok"}


def _openblas_kernels():
    from cavs import blas
    return blas.openblas_kernels()


def _clock() -> dict:
    """The core's clock, from a dependent chain of fused multiply-adds (one at a time: each waits
    FMA_LATENCY_CYCLES for the one before), compiled with Numba."""
    import numba
    import numpy as np

    @numba.njit(fastmath={"contract"})
    def chain(n, x, a, b):
        for _ in range(n):
            x = x * a + b          # LLVM emits one vfmadd per iteration (contracted, not reassociated)
        return x

    n = 20_000_000
    chain(10, np.float64(1.0), np.float64(0.999999), np.float64(1e-7))
    seconds = _fastest_of(lambda: chain(n, np.float64(1.0), np.float64(0.999999), np.float64(1e-7)), 3)
    return {"hz": n * FMA_LATENCY_CYCLES / seconds, "status": "ok"}


MEASUREMENTS = {"time": _time_products, "clock": _clock}


def _measure(kind: str, threads: int = 1, **spec) -> dict:
    spec = {**spec, "threads": threads} if kind == "time" else spec
    return launch.run("experiments.floors", [kind, json.dumps(spec)], threads=threads, time_limit_s=1800)


# ---------------------------------------------------------------- the yardsticks

def time_products(products: list[Product], libraries=LIBRARIES, threads: int = 1) -> dict:
    """{"best": {product: (seconds, library)}, "libraries": {library: status}}: each distinct product
    timed with every installed library at `threads` (a product longer than MAX_TIMED_ROWS scaled
    from its timed shape), the fastest library's time kept."""
    distinct = sorted({p.timed() for p in products}, key=lambda p: (p.layout, p.inner, p.outer, p.rows))
    best, status = {}, {}
    for lib in libraries:
        r = _measure("time", threads, library=lib, products=[[p.layout, p.rows, p.inner, p.outer] for p in distinct])
        status[lib] = r["status"]
        if r["status"] != "ok":
            continue
        for p, s in zip(distinct, r["seconds"]):
            if s is not None and (p not in best or s < best[p][0]):
                best[p] = (s, lib)
    if not best:
        raise RuntimeError(f"no product could be timed: {status}")
    out = {}
    for p in products:
        s, lib = best[p.timed()]
        out[p] = (s * p.rows / p.timed().rows, lib)
    return {"best": out, "libraries": status}


def seconds_of(products: list[Product], timed: dict) -> float:
    return sum(timed["best"][p][0] for p in products)


def matmul_rates(libraries=LIBRARIES) -> dict[str, float]:
    """Each installed library's single-thread float32 rate (flop/s) on one large product."""
    p = Product("nn", *LARGE)
    out = {}
    for lib in libraries:
        r = _measure("time", library=lib, products=[[p.layout, p.rows, p.inner, p.outer]])
        if r["status"] == "ok" and r["seconds"][0]:          # (dnnl-t runs dy W^T only)
            out[lib] = p.flops / r["seconds"][0]
    if not out:
        raise RuntimeError("no GEMM rate could be measured")
    return out


def fma_peak() -> dict:
    """The core's float32 FMA peak: lanes (from the widest vector ISA, or the pipes' width where
    they are narrower: NARROW_PIPES) x FMA pipes x 2 flops x the clock, and how the clock was
    read."""
    from cavs.backend.cpu import cpu_generation
    return _fma_peak(cpu_generation(), _measure("clock"))


def _fma_peak(cpu: dict, clock: dict) -> dict:
    isa = cpu["cpu_isa"]
    lanes = NARROW_PIPES.get((cpu["cpu_vendor"], cpu["cpu_family"], isa), LANES.get(isa, 4))
    hz = clock.get("hz") if clock["status"] == "ok" else None
    return {"isa": isa, "lanes": lanes, "fma_pipes": FMA_PIPES, "clock_ghz": None if hz is None else hz / 1e9,
            "peak_gflops": None if hz is None else lanes * FMA_PIPES * 2 * hz / 1e9,
            "clock_read": f"from a dependent chain of FMAs ({FMA_LATENCY_CYCLES} cycles each)"}


if __name__ == "__main__":
    launch.die_with_parent()
    environment.set_flush_denormals(environment.ftz_requested())
    launch.emit(MEASUREMENTS[sys.argv[1]](**json.loads(sys.argv[2])))
