"""The least time a workload's training can take on this machine, set beside the studies' times
(experiments/studies/bench.py, nary.py; targets.py reads them back).

- `matmul_rate()`: the machine's single-thread float32 GEMM rate on a large product.
- `needed_macs(...)` / `child_sum_macs(...)`: the multiply-adds a paper workload's training needs
  (its products on the rows that have their inputs, the output layer; times 3 for the forward,
  input gradient and weight gradient); the same for the child-sum Tree-LSTM on n-ary trees.
  `floor_s(macs, rate)` is their time at that rate: the floor.
- `frontier_rows`, `frontier_loop`, `frontier_bound`: the same work with each loop task's state
  product timed on its own (small) shape: what any frontier-by-frontier system pays at least.

The GEMMs are timed in fresh one-thread processes (`python -m experiments.floors KIND SPEC`, run
through launch.run), so that nothing this process loaded or started shares their core.
"""
from __future__ import annotations

import json
import sys
import time

from . import environment, launch

GATES = {"tree_lstm": 5, "var_lstm": 4, "fixed_lstm": 4, "tree_fc": 1}   # matmul width / hidden


# ---------------------------------------------------------------- timed in their own processes

def _fastest_of(product, times: int = 5) -> float:
    """Seconds of the fastest of `times` calls, after one untimed call."""
    product()
    best = float("inf")
    for _ in range(times):
        t0 = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - t0)
    return best


def _large_gemm(blas: str) -> dict:
    """flop/s of a (2048 x 1024) x (1024 x 2560) float32 product in NumPy's BLAS or in MKL (through
    PyTorch, the engine's CPU BLAS)."""
    import numpy as np
    a = np.random.rand(2048, 1024).astype(np.float32)
    b = np.random.rand(1024, 2560).astype(np.float32)
    if blas == "mkl":
        import torch
        torch.set_num_threads(1)
        a, b = torch.from_numpy(a), torch.from_numpy(b)
        seconds = _fastest_of(lambda: torch.mm(a, b))
    else:
        seconds = _fastest_of(lambda: a @ b)
    return {"flops_per_s": 2 * 2048 * 1024 * 2560 / seconds, "status": "ok"}


def _state_products(k: int, n: int, rows: list[int]) -> dict:
    """Per row count r: seconds of the forward x W and the input gradient dy W^T of an (r x k)
    state by the (k x n) recurrent weight, each the fastest of 5."""
    import torch
    torch.set_num_threads(1)
    torch.set_flush_denormal(environment.ftz_requested())
    w = torch.rand(k, n)
    seconds = {}
    for r in rows:
        x, y, dy, dx = torch.rand(r, k), torch.empty(r, n), torch.rand(r, n), torch.empty(r, k)
        seconds[r] = _fastest_of(lambda: torch.mm(x, w, out=y)) + _fastest_of(lambda: torch.mm(dy, w.T, out=dx))
    return {"seconds": seconds, "status": "ok"}


MEASUREMENTS = {"rate": _large_gemm, "shapes": _state_products}


def _measure(kind: str, **spec) -> dict:
    return launch.run("experiments.floors", [kind, json.dumps(spec)], threads=1)


# ---------------------------------------------------------------- the floors

def matmul_rate() -> float:
    """The machine's single-thread float32 GEMM rate (flop/s): the faster of NumPy's BLAS and MKL.
    Taking the faster one keeps the floor honest whichever BLAS the engine uses."""
    results = [_measure("rate", blas=blas) for blas in ("numpy", "mkl")]
    rates = [r["flops_per_s"] for r in results if r["status"] == "ok"]
    if not rates:
        raise RuntimeError(f"no GEMM rate could be measured: {[r['status'] for r in results]}")
    return max(rates)


def rate_summary(rates: list[float]) -> str:
    """The rate a study's floors use (the fastest it measured: a slow spell never inflates a floor)."""
    return (f"single-thread float32 matmul rate: {max(rates) / 1e9:.1f} GFLOP/s (the fastest of {len(rates)} "
            f"measurements; the slowest: {min(rates) / 1e9:.1f})")


def floor_s(macs: float, rate: float) -> float:
    return 2 * macs / rate


def state_in_width(workload: str, hidden: int) -> int:
    """Width of the state a vertex multiplies by its recurrent weight (both children's h on trees)."""
    return {"tree_lstm": 2, "tree_fc": 2}.get(workload, 1) * hidden


def needed_macs(workload: str, hidden: int, samples: list) -> float:
    """Training multiply-adds of the matmuls the workload needs (3 x forward)."""
    import cavs
    s = cavs.workloads.sizes(workload, hidden)
    graphs = [cavs.workloads.to_graph(workload, x, i) for i, x in enumerate(samples)]
    with_input = sum(int((g.tokens >= 0).sum()) for g in graphs)
    with_children = sum(int((g.children >= 0).any(axis=1).sum()) for g in graphs)
    labelled = sum(int((g.labels >= 0).sum()) for g in graphs)
    gates, state_in = GATES[workload], state_in_width(workload, hidden)
    forward = with_input * s.embed * gates * hidden * (workload != "tree_fc") \
        + with_children * state_in * gates * hidden + labelled * hidden * s.classes
    return 3.0 * forward


def child_sum_macs(trees, hidden: int, embed: int, classes: int) -> float:
    """Training multiply-adds of the child-sum Tree-LSTM's products on `trees` (3 x forward), each
    product only on the rows that have its input: `x W` and `x Wf` at vertices with a word,
    `h_sum U` at vertices with children, `h_k Uf` once per actual child, the output layer at
    labelled vertices."""
    H, E = hidden, embed
    words = sum(int((g.tokens >= 0).sum()) for g in trees)
    inner = sum(int((g.children >= 0).any(axis=1).sum()) for g in trees)
    edges = sum(int((g.children >= 0).sum()) for g in trees)
    labelled = sum(int((g.labels >= 0).sum()) for g in trees)
    forward = words * E * 4 * H + inner * H * 3 * H + edges * H * H + labelled * H * classes
    return 3.0 * forward


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


def frontier_loop(workload: str, hidden: int, samples: list) -> tuple[float, float]:
    """The loop's state matmuls (forward, and the input gradient in reverse) timed on each task's
    own shape (its rows with children x the recurrent weight), in isolation with one thread:
    (their seconds, their flops)."""
    gates, state_in = GATES[workload], state_in_width(workload, hidden)
    rows = frontier_rows(workload, hidden, samples)
    timed = _measure("shapes", k=state_in, n=gates * hidden, rows=sorted(set(rows)))
    if timed["status"] != "ok":
        raise RuntimeError(f"timing the loop's state products: {timed['status']}")
    per_shape = {int(r): t for r, t in timed["seconds"].items()}
    return sum(per_shape[r] for r in rows), 2 * 2.0 * sum(rows) * state_in * gates * hidden


def frontier_bound(floor: float, rate: float, loop_s: float, loop_flops: float) -> float:
    """A floor for frontier-by-frontier execution: the same multiply-adds as the floor, but
    the loop's state matmuls at their own shapes' time (frontier_loop), the rest (input
    projections, weight gradients, output layer) at the large-GEMM `rate`. The gap between this
    and the floor is what small frontiers cost any batching system that respects the
    dependencies: each task streams the whole weight matrix through the cache."""
    return floor - loop_flops / rate + loop_s


if __name__ == "__main__":
    launch.die_with_parent()
    launch.emit(MEASUREMENTS[sys.argv[1]](**json.loads(sys.argv[2])))
