"""The child-sum Tree-LSTM on n-ary trees (the paper's Figure 4): Cavs with the children as edges,
beside Cavs with child slots and DyNet with autobatching, against the floor and the frontier bound;
and the edge form's time per edge at maximum degrees 4, 32 and 256.

    python -m experiments.studies nary                     # the measurement (512 trees, h 256, E 128)
    python -m experiments.studies nary --trees 128 --hidden 32 --embed 16 --results /tmp/nary   # a quick try
    python -m experiments.studies nary --check             # DyNet's losses against Cavs's (JSON)

Workload: the first `--trees` (512) n-ary SST training trees (`cavs.datasets.sst_nary_trees`,
file order), batches of 64, h = 256, embedding width 128, 5 classes, one SGD step per batch
(lr 1.0, gradients clipped to a global norm of 5; the engine's default and DyNet's SimpleSGD with
clip threshold 5), flush-to-zero and denormals-are-zero as the sweeps set them ($CAVS_FTZ, on by
default; experiments/cell.py). Cells:

  cavs           cavs.models.child_sum on v.children(): any degree, the per-child work once per task
                 over all its edges
  cavs-slots     the same model on child slots (gather_all() up to the largest degree in the data):
                 one copy of the per-child work per slot, the slots no vertex of a task uses skipped
  dynet          the same model in DyNet with autobatching (agenda, DyNet's default):
                 baselines/dynet_child_sum.py; a vertex loops over its actual children
  cavs-prebuilt  not a competitor: `cavs` with every batch built before the clock starts and
                 stepped once untimed, so that the timed passes pay neither graph construction
                 nor the engine's per-batch analysis: the most that making them cheaper could gain
  cavs-deg4/32/256  `cavs` on synthetic trees with the same number of edges (16,384, in 8 batches
                 of 2,048) and a maximum degree of 4, 32 and 256: each tree is a root with d children,
                 each of them with 3 leaves (3 levels; words on the leaves, labels everywhere), so the
                 batches have the same tasks and rows and differ in the degree; run with an empty
                 kernel cache, so that `first_step_s` includes compiling the kernels (the GEMM
                 choices, cavs/blas.py, are the machine's, copied from the warm cache)

Each cell runs in its own one-thread process (launch.run); one warm-up batch is stepped untimed
(it also compiles Cavs's kernels); then `--passes` (4) passes over all batches, the fastest kept;
the cells run in `--rounds` (5) interleaved rounds, each cell keeping its fastest round. Graph
construction is included: Cavs's `model.make_batch` (checks, levels, schedule) and DyNet's
per-batch expression graph are inside the timed step; `construct_s` reports that part alone.
The floor (`floor_s`, per cell's trees): the products the model needs (floors.child_sum_products),
each over all its rows, at the fastest installed library's time on its shape; the frontier bound
(`frontier_bound_s`): the same with the loop's products (h_sum U on each task's vertices with
children, h_k Uf on its edges, and their input gradients) timed per task. Both are measured every
round, the least kept. Writes RESULTS/nary.csv (with the git revision) and prints a table.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .. import arguments, environment, floors, launch

CLASSES = 5
# name -> (system, form (edges / slots), tree set, batches built untimed)
CELLS = {
    "cavs": ("cavs", "edges", "sst", False),
    "cavs-slots": ("cavs", "slots", "sst", False),
    "dynet": ("dynet", "edges", "sst", False),
    "cavs-prebuilt": ("cavs", "edges", "sst", True),
    "cavs-deg4": ("cavs", "edges", "deg4", False),
    "cavs-deg32": ("cavs", "edges", "deg32", False),
    "cavs-deg256": ("cavs", "edges", "deg256", False),
}
SYNTHETIC_EDGES, SYNTHETIC_BATCHES, LEAVES_PER_CHILD = 16_384, 8, 3
FIELDS = ["cell", "system", "form", "trees", "max_degree", "vertices", "edges", "hidden", "embed", "batch_size",
          "passes", "rounds", "best_s", "pass_s", "construct_s", "per_edge_us", "first_step_s", "engine_s",
          "trees_per_s", "first_loss", "last_loss", "floor_s", "frontier_bound_s", "over_floor",
          "over_frontier_bound", "floor_libraries", "blas", "ftz", "cpu_steal", "status", "git_rev"]


def cell_names(text: str) -> list[str]:
    import argparse
    names = [c for c in text.split(",") if c]
    unknown = sorted(set(names) - set(CELLS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown cells {unknown}; known: {', '.join(CELLS)}")
    return names


def add_arguments(ap) -> None:
    ap.add_argument("--trees", type=arguments.count, default=512, help="n-ary SST training trees, file order (default 512)")
    ap.add_argument("--hidden", type=arguments.count, default=256, help="h (default 256)")
    ap.add_argument("--embed", type=arguments.count, default=128, help="embedding width (default 128)")
    ap.add_argument("--batch-size", type=arguments.count, default=64, help="SST trees per step (default 64)")
    ap.add_argument("--passes", type=arguments.count, default=4, help="timed passes per cell process (fastest kept; 2 left the degree cells 1.2-1.4x apart on a noisy VM)")
    ap.add_argument("--rounds", type=arguments.count, default=5, help="interleaved rounds over the cells (fastest kept)")
    ap.add_argument("--cells", type=cell_names, default=list(CELLS), help=f"comma-separated, of {', '.join(CELLS)}")
    ap.add_argument("--timeout", type=arguments.count, default=3600, help="seconds per cell")
    ap.add_argument("--check", action="store_true", help="print Cavs's and DyNet's losses (JSON) and exit")


def degree(g) -> int:
    return int((g.children >= 0).sum(axis=1).max())


def vocab_size() -> int:
    import cavs
    return len(cavs.datasets.sst_vocab()) + 1


def synthetic_trees(max_degree: int, seed: int = 0):
    """SYNTHETIC_EDGES edges in trees of one shape: a root with `max_degree` children, each with
    LEAVES_PER_CHILD leaves; words on the leaves, a label on every vertex."""
    import numpy as np
    import cavs
    rng = np.random.default_rng(seed)
    per_tree = max_degree * (1 + LEAVES_PER_CHILD)
    vocab = vocab_size()
    trees = []
    for t in range(SYNTHETIC_EDGES // per_tree):
        kids = [[] for _ in range(per_tree + 1)]
        kids[0] = list(range(1, max_degree + 1))
        leaf = max_degree + 1
        for c in range(1, max_degree + 1):
            kids[c] = list(range(leaf, leaf + LEAVES_PER_CHILD))
            leaf += LEAVES_PER_CHILD
        n = per_tree + 1
        tokens = np.where(np.arange(n) > max_degree, rng.integers(1, vocab, n), -1)
        trees.append(cavs.Graph.from_children(kids, tokens=tokens, labels=rng.integers(0, CLASSES, n),
                                              name=f"degree {max_degree} tree {t}"))
    return trees


def load_trees(spec: dict):
    """(trees, batch size) of a cell's tree set."""
    import cavs
    subset = CELLS[spec["cell"]][2]
    if subset == "sst":
        return cavs.datasets.sst_nary_trees("train", limit=spec["trees"]), spec["batch_size"]
    trees = synthetic_trees(int(subset[len("deg"):]))
    return trees, len(trees) // SYNTHETIC_BATCHES


def child_sum_model(form: str, trees, hidden: int, embed: int, **options):
    from cavs.models.child_sum import model
    arity = None if form == "edges" else max(degree(g) for g in trees)
    return model(arity, hidden, embed, vocab_size(), classes=CLASSES, **options)


def counts(trees) -> dict:
    return {"trees": len(trees), "vertices": int(sum(g.num_vertices for g in trees)),
            "edges": int(sum((g.children >= 0).sum() for g in trees)), "max_degree": max(degree(g) for g in trees)}


# ---------------------------------------------------------------- one cell (in its own process)

def cell(spec: dict) -> dict:
    ftz = environment.ftz_requested()               # $CAVS_FTZ, the harness's setting (default on)
    environment.set_flush_denormals(ftz)            # first, before any framework starts a thread
    launch.pin_threads(1)
    import numpy as np
    import cavs
    from baselines.dynet_child_sum import DynetChildSum
    system, form, _, prebuilt = CELLS[spec["cell"]]
    trees, bs = load_trees(spec)
    batches = [trees[i:i + bs] for i in range(0, len(trees) - bs + 1, bs)] or [trees]
    model = child_sum_model(form, trees, spec["hidden"], spec["embed"])
    construct = [0.0]
    t0 = time.perf_counter()
    if system == "cavs":
        engine = cavs.Engine(model, threads=1)
        built = {id(graphs): model.make_batch(graphs) for graphs in batches} if prebuilt else {}

        def step(graphs):
            if prebuilt:
                return engine.step(built[id(graphs)])
            t = time.perf_counter()
            batch = model.make_batch(graphs)
            construct[0] += time.perf_counter() - t
            return engine.step(batch)
        blas = engine.backend.blas
    else:
        dynet = DynetChildSum(model.init_params(), batch_size=bs)

        def step(graphs):
            before = dynet.timings.construct_s
            loss = dynet.step(dynet.prepare(graphs))
            construct[0] += dynet.timings.construct_s - before
            return loss
        blas = dynet.blas
    engine_s = time.perf_counter() - t0
    environment.set_flush_denormals(ftz)                # whatever the system set (DyNet turns it on)
    t0 = time.perf_counter()
    for graphs in batches if prebuilt else batches[:1]:
        step(graphs)                                    # warm-up, untimed (compiles Cavs's kernels)
    first_step = time.perf_counter() - t0
    environment.set_flush_denormals(ftz)
    best, best_construct, losses, passes = float("inf"), 0.0, [], []
    steal = None
    for _ in range(spec["passes"]):
        construct[0] = 0.0
        counters = environment.cpu_counters()
        t0 = time.perf_counter()
        losses = [step(g) for g in batches]
        elapsed = time.perf_counter() - t0
        passes.append(round(elapsed, 4))
        if elapsed < best:
            best, best_construct = elapsed, construct[0]
            steal = environment.steal_share(counters, environment.cpu_counters())
    timed = [g for b in batches for g in b]
    info = counts(timed)
    return {"cell": spec["cell"], "system": system, "form": form, **info, "hidden": spec["hidden"],
            "embed": spec["embed"], "batch_size": bs, "passes": spec["passes"], "best_s": round(best, 4),
            "pass_s": " ".join(map(str, passes)), "construct_s": round(best_construct, 4),
            "per_edge_us": round(best / info["edges"] * 1e6, 3), "first_step_s": round(first_step, 3),
            "engine_s": round(engine_s, 3), "trees_per_s": round(info["trees"] / best, 2),
            "first_loss": round(float(losses[0]), 6), "last_loss": round(float(np.mean(losses[-1])), 6),
            "blas": blas, "ftz": ftz, "cpu_steal": steal, "status": "ok"}


def check(args) -> dict:
    """Cavs and DyNet from the same weights on the same batch: the loss of three SGD steps each."""
    launch.pin_threads(1)
    import cavs
    from baselines.dynet_child_sum import DynetChildSum
    trees = cavs.datasets.sst_nary_trees("train", limit=args.trees)[:args.batch_size]
    model = child_sum_model("edges", trees, args.hidden, args.embed, seed=3)
    engine = cavs.Engine(model, fusion=False, threads=1)
    dynet = DynetChildSum(dict(engine.params), batch_size=len(trees))
    batch = model.make_batch(trees)
    ours = [engine.step(batch) for _ in range(3)]
    theirs = [dynet.step(dynet.prepare(trees)) for _ in range(3)]
    return {"max_degree": max(degree(g) for g in trees), "trees": len(trees), "cavs": ours, "dynet": theirs}


# ---------------------------------------------------------------- the driver

def measure(name: str, args) -> dict:
    spec = {"cell": name, "trees": args.trees, "hidden": args.hidden, "embed": args.embed,
            "batch_size": args.batch_size, "passes": args.passes}
    environ = None
    if CELLS[name][2] != "sst":          # the degree sweep compiles its kernels in the first step
        cache = tempfile.mkdtemp(prefix="cavs-nary-cold-")
        environ = {**os.environ, "CAVS_KERNEL_CACHE": cache}
        # but multiplies with the machine's measured GEMM choices, as the other cells do: measured
        # anew in each cell, their noise alone set the degrees apart (by up to 1.18x per edge)
        from cavs.fusion import kernel_cache_dir
        for choices in (kernel_cache_dir() or Path(cache)).glob("blas-*.json"):
            shutil.copy(choices, cache)
    return {"cell": name, **launch.run("experiments.studies", ["nary", "--cell", json.dumps(spec)],
                                       time_limit_s=args.timeout, environ=environ)}


def yardsticks(trees, batch_size: int, args) -> dict:
    """The floor and the frontier bound of the child-sum model on `trees` (see the docstring)."""
    needed = floors.child_sum_products(trees, args.hidden, args.embed, CLASSES, batch_size)
    frontier = floors.child_sum_frontier(trees, args.hidden, batch_size)
    loop = {("nn", args.hidden, 3 * args.hidden), ("nt", 3 * args.hidden, args.hidden),
            ("nn", args.hidden, args.hidden), ("nt", args.hidden, args.hidden)}
    state = [p for p in needed if (p.layout, p.inner, p.outer) in loop]
    timed = floors.time_products(needed + frontier)
    floor = floors.seconds_of(needed, timed)
    won = {}
    for p in needed:
        won[timed["best"][p][1]] = won.get(timed["best"][p][1], 0) + 1
    return {"floor_s": floor, "frontier_bound_s": floor - floors.seconds_of(state, timed) + floors.seconds_of(frontier, timed),
            "floor_libraries": " ".join(f"{k}:{v}" for k, v in sorted(won.items()))}


def table(rows: list[dict]) -> str:
    by = {r["cell"]: r for r in rows}
    lines = [f"{'cell':14} {'trees':>5} {'maxdeg':>6} {'edges':>6} {'best s':>8} {'construct':>9} {'us/edge':>8} "
             f"{'1st step':>8} {'floor s':>8} {'/floor':>6} {'bound s':>8} {'/bound':>6}  status"]
    for r in rows:
        if r.get("status") != "ok":
            lines.append(f"{r['cell']:14} {r.get('status')}")
            continue
        lines.append(f"{r['cell']:14} {r['trees']:5d} {r['max_degree']:6d} {r['edges']:6d} {r['best_s']:8.3f} "
                     f"{r['construct_s']:9.3f} {r['per_edge_us']:8.2f} {r['first_step_s']:8.2f} {r['floor_s']:8.3f} "
                     f"{r['over_floor']:6.2f} {r['frontier_bound_s']:8.3f} {r['over_frontier_bound']:6.2f}  ok")
    for a, b in (("dynet", "cavs"), ("cavs-slots", "cavs"), ("cavs", "cavs-prebuilt"), ("cavs-deg4", "cavs-deg256"),
                 ("cavs-deg32", "cavs-deg256")):
        if by.get(a, {}).get("status") == "ok" and by.get(b, {}).get("status") == "ok":
            field = "per_edge_us" if a.startswith("cavs-deg") else "best_s"
            lines.append(f"{a} / {b}: {by[a][field] / by[b][field]:.2f}x ({field})")
    return "\n".join(lines)


def main(results_dir: Path, args) -> int:
    if args.check:
        print(json.dumps(check(args)), flush=True)
        return 0
    cells, rev, best = args.cells, environment.git_revision(), {}
    sets = sorted({CELLS[c][2] for c in cells})
    trees_of = {s: load_trees({"cell": next(c for c in cells if CELLS[c][2] == s), "trees": args.trees,
                               "batch_size": args.batch_size}) for s in sets}
    sticks = {s: [] for s in sets}
    for round_ in range(args.rounds):
        for s in sets:
            trees, bs = trees_of[s]
            timed_trees = trees[:len(trees) - len(trees) % bs] or trees
            sticks[s].append(yardsticks(timed_trees, bs, args))
        for name in cells:
            r = {**measure(name, args), "rounds": args.rounds, "git_rev": rev}
            print(f"round {round_ + 1} {name}: {r.get('best_s', '')} s ({r.get('status')})", flush=True)
            launch.keep_fastest(best, name, r, "best_s")
    rows = [best[c] for c in cells]
    for r in rows:
        if r.get("status") == "ok":
            mine = sticks[CELLS[r["cell"]][2]]
            least = {k: min(s[k] for s in mine) for k in ("floor_s", "frontier_bound_s")}
            r.update(least, floor_libraries=mine[-1]["floor_libraries"],
                     over_floor=round(r["best_s"] / least["floor_s"], 3),
                     over_frontier_bound=round(r["best_s"] / least["frontier_bound_s"], 3))
    out = launch.write_rows(results_dir / "nary.csv", rows, FIELDS)
    print(table(rows))
    print(f"wrote {out}")
    return 0 if all(r.get("status") == "ok" for r in rows) else 1
