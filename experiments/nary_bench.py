"""Child-sum Tree-LSTM on n-ary trees (issue 11): Cavs against the same model in DyNet with
autobatching, and Cavs with 32 child slots against 4 on trees that fit both.

    python -m experiments.nary_bench                       # the measurement (512 trees, h 256, E 128)
    python -m experiments.nary_bench --trees 128 --hidden 32 --embed 16 --results /tmp/nary   # a quick try
    python -m experiments.nary_bench --check               # DyNet's losses against Cavs's (JSON)

Workload: the first `--trees` (512) n-ary SST training trees (`cavs.datasets.sst_nary_trees`,
file order), batches of 64, h = 256, embedding width 128, 5 classes, one SGD step per batch
(lr 1.0, gradients clipped to a global norm of 5; the engine's default and DyNet's SimpleSGD with
clip threshold 5), flush-to-zero and denormals-are-zero as the sweeps set them ($CAVS_FTZ, on by
default; experiments/cell.py). Cells:

  cavs           examples/child_sum_tree_lstm.py, arity = the largest degree in the data
  dynet          the same model in DyNet with autobatching (agenda, DyNet's default), configured as
                 baselines/dynet_autobatch.py does (dynet_config before import, memory pools sized
                 up front); a vertex loops over its actual children, as a DyNet user writes it
  cavs-k32/-k4   Cavs with arity 32 and arity 4 on the first `--trees` trees of degree <= 4
  cavs-prebuilt  not a competitor: `cavs` with every batch built before the clock starts and
                 stepped once untimed, so that the timed passes pay neither graph construction
                 nor the engine's per-batch analysis (cached on the batch): what the epoch would
                 cost were both free, the most that making them cheaper could gain

Each cell runs in its own subprocess with one thread (OMP/MKL/OpenBLAS/Numba variables,
threadpoolctl and torch.set_num_threads(1)); one warm-up batch is stepped untimed (it also
compiles Cavs's kernels); then `--passes` (2) passes over all batches, the fastest kept; the cells
run in `--rounds` (3) interleaved rounds (a slow spell of this shared VM hits every cell, and single
passes of the same cell differ by up to 20% here), each cell keeping its fastest round. Graph
construction is included: Cavs's `model.make_batch` (checks, levels, schedule) and DyNet's
per-batch expression graph are inside the timed step; `construct_s` reports that part alone.
The floor (`floor_s`, per cell's trees): the multiply-adds the model needs, each product only on
the rows that have its input (`x W` and `x Wf` at vertices with a word, `h_sum U` at vertices
with children, `h_k Uf` once per actual child, the output layer at labelled vertices), times 3
for training (forward, input gradient, weight gradient; the embedding is trained), at this
machine's single-thread float32 GEMM rate (experiments.bench.matmul_rate, measured before and after
every round, the fastest kept: the least time the machine showed the products need).
Writes RESULTS/nary.csv (with the git revision) and prints a table.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "NUMBA_NUM_THREADS": "1"}
MARK = "NARY_RESULT "
CLASSES = 5
LR, CLIP = 1.0, 5.0            # the engine's default optimizer (WORKLOADS.md), DyNet's SimpleSGD alike
CELLS = {     # name -> (system, arity (None: the data's largest degree), tree subset, batches built untimed)
    "cavs": ("cavs", None, "all", False),
    "dynet": ("dynet", None, "all", False),
    "cavs-k32": ("cavs", 32, "deg4", False),
    "cavs-k4": ("cavs", 4, "deg4", False),
    "cavs-prebuilt": ("cavs", None, "all", True),
}
FIELDS = ["cell", "system", "subset", "trees", "arity", "max_degree", "vertices", "hidden", "embed",
          "batch_size", "passes", "rounds", "best_s", "pass_s", "construct_s", "trees_per_s", "first_loss", "last_loss",
          "floor_s", "over_floor", "matmul_gflops", "ftz", "status", "git_rev"]


def child_sum():
    spec = importlib.util.spec_from_file_location("child_sum_tree_lstm", ROOT / "examples" / "child_sum_tree_lstm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def degree(g) -> int:
    return int((g.children >= 0).sum(axis=1).max())


def load_trees(count: int, subset: str):
    import cavs
    if subset == "all":
        return cavs.datasets.sst_nary_trees("train", limit=count)
    trees = [g for g in cavs.datasets.sst_nary_trees("train", limit=count * 8) if degree(g) <= 4]
    return trees[:count]


def needed_macs(trees, hidden: int, embed: int, classes: int = CLASSES) -> float:
    """Training multiply-adds of the child-sum Tree-LSTM's products on `trees` (3 x forward),
    each product only on the rows that have its input."""
    H, E = hidden, embed
    words = sum(int((g.tokens >= 0).sum()) for g in trees)
    inner = sum(int((g.children >= 0).any(axis=1).sum()) for g in trees)
    edges = sum(int((g.children >= 0).sum()) for g in trees)
    labelled = sum(int((g.labels >= 0).sum()) for g in trees)
    forward = words * E * 4 * H + inner * H * 3 * H + edges * H * H + labelled * H * classes
    return 3.0 * forward


def vocab_size() -> int:
    import cavs
    return len(cavs.datasets.sst_vocab()) + 1


def pin_one_thread():
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass


# ---------------------------------------------------------------- the model in DyNet

class DynetChildSum:
    """The child-sum Tree-LSTM of examples/child_sum_tree_lstm.py in DyNet, from given weights
    (names and row-convention shapes as Cavs's `engine.params`; DyNet multiplies column vectors,
    so every matrix but the embedding is stored transposed)."""

    def __init__(self, params: dict, batch_size: int):
        from baselines.dynet_autobatch import _dynet, pool_mb
        hidden = params["Uf"].shape[0]
        self.dy = dy = _dynet(1, 0, pool_mb("tree_lstm", hidden, batch_size, 256))
        import numpy as np
        self.hidden = hidden
        self.pc = dy.ParameterCollection()
        self.p = {}
        for name, value in params.items():
            value = np.asarray(value, dtype=np.float32)
            if name == "emb":
                self.p[name] = self.pc.add_lookup_parameters(value.shape, name=name)
                self.p[name].init_from_array(value)
            else:
                self.p[name] = self.pc.add_parameters(value.shape[::-1], name=name)
                self.p[name].set_value(np.ascontiguousarray(value.T))
        self.trainer = dy.SimpleSGDTrainer(self.pc, learning_rate=LR)
        self.trainer.set_clip_threshold(CLIP)
        self.construct_s = 0.0

    def _graph(self, g, p):
        dy, H = self.dy, self.hidden
        kids = [[int(c) for c in row if c >= 0] for row in g.children]
        hs, cs = [None] * g.num_vertices, [None] * g.num_vertices
        for v in order_children_first(kids):
            tok = int(g.tokens[v])
            x = p["emb"][tok] if tok >= 0 else None
            terms = [p["b"]] + ([p["W"], x] if x is not None else [])
            if kids[v]:
                h_sum = dy.esum([hs[k] for k in kids[v]]) if len(kids[v]) > 1 else hs[kids[v][0]]
                terms += [p["U"], h_sum]
            gates = dy.affine_transform(terms)
            i, o = dy.logistic(dy.pick_range(gates, 0, H)), dy.logistic(dy.pick_range(gates, H, 2 * H))
            u = dy.tanh(dy.pick_range(gates, 2 * H, 3 * H))
            fx = dy.affine_transform([p["bf"], p["Wf"], x]) if x is not None else p["bf"]
            c = [dy.cmult(i, u)]
            for k in kids[v]:                                   # one forget gate per actual child
                c.append(dy.cmult(dy.logistic(dy.affine_transform([fx, p["Uf"], hs[k]])), cs[k]))
            cs[v] = dy.esum(c) if len(c) > 1 else c[0]
            hs[v] = dy.cmult(o, dy.tanh(cs[v]))
        return [dy.pickneglogsoftmax(dy.affine_transform([p["bout"], p["Wout"], hs[v]]), int(label))
                for v, label in enumerate(g.labels) if label >= 0]

    def step(self, graphs, train: bool = True) -> float:
        dy = self.dy
        t0 = time.perf_counter()
        dy.renew_cg()
        p = {k: (q if k == "emb" else q.expr(True)) for k, q in self.p.items()}
        losses = [loss for g in graphs for loss in self._graph(g, p)]
        loss = dy.esum(losses) * (1.0 / len(losses))           # the mean over the labelled vertices
        self.construct_s += time.perf_counter() - t0
        value = loss.value()
        if train:
            loss.backward()
            self.trainer.update()
        return float(value)


def order_children_first(kids) -> list[int]:
    order, seen = [], [False] * len(kids)
    for root in range(len(kids)):
        stack = [(root, False)]
        while stack:
            v, done = stack.pop()
            if done:
                order.append(v)
            elif not seen[v]:
                seen[v] = True
                stack.append((v, True))
                stack.extend((c, False) for c in reversed(kids[v]) if not seen[c])
    return order


# ---------------------------------------------------------------- one cell (in its own process)

def run_cell(spec: dict) -> dict:
    from . import environment
    ftz = environment.ftz_requested()               # $CAVS_FTZ, the harness's setting (default on)
    environment.set_flush_denormals(ftz)            # first, before any framework starts a thread
    pin_one_thread()
    import numpy as np
    import cavs
    system, arity, subset, prebuilt = CELLS[spec["cell"]]
    trees = load_trees(spec["trees"], subset)
    bs = spec["batch_size"]
    batches = [trees[i:i + bs] for i in range(0, len(trees) - bs + 1, bs)] or [trees]
    max_deg = max(degree(g) for g in trees)
    arity = arity or max_deg
    model = child_sum().model(arity, spec["hidden"], spec["embed"], vocab_size(), classes=CLASSES)
    if system == "cavs":
        engine = cavs.Engine(model, threads=1)
        built = {id(graphs): model.make_batch(graphs) for graphs in batches} if prebuilt else {}

        def step(graphs):
            if prebuilt:
                return engine.step(built[id(graphs)])
            t0 = time.perf_counter()
            batch = model.make_batch(graphs)
            construct[0] += time.perf_counter() - t0
            return engine.step(batch)
    else:
        dynet = DynetChildSum(model.init_params(), bs)

        def step(graphs):
            return dynet.step(graphs)
    construct = [0.0]
    environment.set_flush_denormals(ftz)                # whatever the system set (DyNet turns it on)
    for graphs in batches if prebuilt else batches[:1]:
        step(graphs)                                    # warm-up, untimed (compiles Cavs's kernels)
    environment.set_flush_denormals(ftz)
    best, best_construct, losses, passes = float("inf"), 0.0, [], []
    for _ in range(spec["passes"]):
        construct[0] = 0.0
        if system == "dynet":
            dynet.construct_s = 0.0
        t0 = time.perf_counter()
        losses = [step(g) for g in batches]
        elapsed = time.perf_counter() - t0
        passes.append(round(elapsed, 4))
        if elapsed < best:
            best = elapsed
            best_construct = construct[0] if system == "cavs" else dynet.construct_s
    n = sum(len(b) for b in batches)
    macs = needed_macs([g for b in batches for g in b], spec["hidden"], spec["embed"])
    return {"cell": spec["cell"], "system": system, "subset": subset, "trees": n, "arity": arity,
            "max_degree": max_deg, "vertices": int(sum(g.num_vertices for b in batches for g in b)),
            "hidden": spec["hidden"], "embed": spec["embed"], "batch_size": bs, "passes": spec["passes"],
            "best_s": round(best, 4), "pass_s": " ".join(map(str, passes)), "construct_s": round(best_construct, 4),
            "trees_per_s": round(n / best, 2), "first_loss": round(float(losses[0]), 6),
            "last_loss": round(float(np.mean(losses[-1])), 6), "macs": macs, "ftz": ftz, "status": "ok"}


def check(args) -> dict:
    """Cavs and DyNet from the same weights on the same batch: the loss of three SGD steps each."""
    pin_one_thread()
    import cavs
    trees = load_trees(args.trees, "all")[:args.batch_size]
    arity = max(degree(g) for g in trees)
    model = child_sum().model(arity, args.hidden, args.embed, vocab_size(), classes=CLASSES, seed=3)
    engine = cavs.Engine(model, fusion=False, threads=1)
    dynet = DynetChildSum(dict(engine.params), len(trees))
    batch = model.make_batch(trees)
    ours = [engine.step(batch) for _ in range(3)]
    theirs = [dynet.step(trees) for _ in range(3)]
    return {"arity": arity, "trees": len(trees), "cavs": ours, "dynet": theirs}


# ---------------------------------------------------------------- the driver

def measure(cell: str, args) -> dict:
    spec = {"cell": cell, "trees": args.trees, "hidden": args.hidden, "embed": args.embed,
            "batch_size": args.batch_size, "passes": args.passes}
    env = {**os.environ, **THREAD_ENV}
    try:
        proc = subprocess.run([sys.executable, "-m", "experiments.nary_bench", "--cell", json.dumps(spec)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"cell": cell, "status": f"timed out after {args.timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"cell": cell, "status": f"failed: exit {proc.returncode}: {tail}"}


def table(rows: list[dict]) -> str:
    by = {r["cell"]: r for r in rows}
    lines = [f"{'cell':13} {'trees':>5} {'K':>3} {'maxdeg':>6} {'best s':>8} {'construct s':>11} "
             f"{'trees/s':>8} {'loss':>8} {'floor s':>8} {'/floor':>6}  status"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"{r['cell']:13} {r.get('status')}")
            continue
        lines.append(f"{r['cell']:13} {r['trees']:5d} {r['arity']:3d} {r['max_degree']:6d} {r['best_s']:8.3f} "
                     f"{r['construct_s']:11.3f} {r['trees_per_s']:8.1f} {r['last_loss']:8.4f} {r['floor_s']:8.3f} "
                     f"{r['over_floor']:6.2f}  ok")
    for a, b in (("dynet", "cavs"), ("cavs-k32", "cavs-k4"), ("cavs", "cavs-prebuilt")):
        if by.get(a, {}).get("status") == "ok" and by.get(b, {}).get("status") == "ok":
            lines.append(f"{a} / {b}: {by[a]['best_s'] / by[b]['best_s']:.2f}x")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--embed", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--passes", type=int, default=2, help="timed passes per cell process (fastest kept)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the cells (fastest kept)")
    ap.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of {', '.join(CELLS)}")
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    ap.add_argument("--check", action="store_true", help="print Cavs's and DyNet's losses (JSON) and exit")
    ap.add_argument("--cell", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cell:
        print(MARK + json.dumps(run_cell(json.loads(args.cell))), flush=True)
        return
    if args.check:
        print(json.dumps(check(args)), flush=True)
        return
    cells = [c for c in args.cells.split(",") if c]
    unknown = set(cells) - set(CELLS)
    if unknown:
        ap.error(f"unknown cells {sorted(unknown)}; known: {', '.join(CELLS)}")
    from .bench import matmul_rate
    from .environment import git_revision
    rates, rev, best = [matmul_rate()], git_revision(), {}
    for round_ in range(args.rounds):
        for cell in cells:
            r = {**measure(cell, args), "rounds": args.rounds, "git_rev": rev}
            print(f"round {round_ + 1} {cell}: {r.get('best_s', '')} s ({r.get('status')})", flush=True)
            if cell not in best or r.get("best_s", float("inf")) < best[cell].get("best_s", float("inf")):
                best[cell] = r
        rates.append(matmul_rate())
    rate = max(rates)        # as experiments.bench: the floor is never inflated by a slow spell
    rows = [best[c] for c in cells]
    for r in rows:
        if r.get("status") == "ok":
            floor = r.pop("macs") * 2 / rate
            r.update(floor_s=round(floor, 6), over_floor=round(r["best_s"] / floor, 3),
                     matmul_gflops=round(rate / 1e9, 2))
    out = Path(args.results) / "nary.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(table(rows))
    print(f"single-thread float32 matmul rate: {rate / 1e9:.1f} GFLOP/s (the fastest of {len(rates)} "
          f"measurements; the slowest: {min(rates) / 1e9:.1f})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
