"""Child-sum Tree-LSTM on n-ary trees: Cavs against the same model in DyNet with autobatching, and
Cavs with 32 child slots against 4 on trees that fit both.

    python -m experiments.studies nary                     # the measurement (512 trees, h 256, E 128)
    python -m experiments.studies nary --trees 128 --hidden 32 --embed 16 --results /tmp/nary   # a quick try
    python -m experiments.studies nary --check             # DyNet's losses against Cavs's (JSON)

Workload: the first `--trees` (512) n-ary SST training trees (`cavs.datasets.sst_nary_trees`,
file order), batches of 64, h = 256, embedding width 128, 5 classes, one SGD step per batch
(lr 1.0, gradients clipped to a global norm of 5; the engine's default and DyNet's SimpleSGD with
clip threshold 5), flush-to-zero and denormals-are-zero as the sweeps set them ($CAVS_FTZ, on by
default; experiments/cell.py). Cells:

  cavs           cavs/models/child_sum.py's model, arity = the largest degree in the data
  dynet          the same model in DyNet with autobatching (agenda, DyNet's default):
                 baselines/dynet_child_sum.py; a vertex loops over its actual children, as a DyNet
                 user writes it
  cavs-k32/-k4   Cavs with arity 32 and arity 4 on the first `--trees` trees of degree <= 4
  cavs-prebuilt  not a competitor: `cavs` with every batch built before the clock starts and
                 stepped once untimed, so that the timed passes pay neither graph construction
                 nor the engine's per-batch analysis (cached on the batch): what the epoch would
                 cost were both free, the most that making them cheaper could gain

Each cell runs in its own one-thread process (launch.run); one warm-up batch is stepped untimed
(it also compiles Cavs's kernels); then `--passes` (2) passes over all batches, the fastest kept;
the cells run in `--rounds` (3) interleaved rounds (a slow spell of this shared VM hits every cell,
and single passes of the same cell differ by up to 20% here), each cell keeping its fastest round.
Graph construction is included: Cavs's `model.make_batch` (checks, levels, schedule) and DyNet's
per-batch expression graph are inside the timed step; `construct_s` reports that part alone.
The floor (`floor_s`, per cell's trees): the multiply-adds the model needs, each product only on
the rows that have its input (floors.child_sum_macs), times 3 for training (the embedding is
trained), at this machine's single-thread float32 GEMM rate (floors.matmul_rate, measured before
and after every round, the fastest kept: the least time the machine showed the products need).
Writes RESULTS/nary.csv (with the git revision) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .. import environment, floors, launch

CLASSES = 5
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


def cell_names(text: str) -> list[str]:
    names = [c for c in text.split(",") if c]
    unknown = sorted(set(names) - set(CELLS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown cells {unknown}; known: {', '.join(CELLS)}")
    return names


def add_arguments(ap) -> None:
    ap.add_argument("--trees", type=int, default=512, help="n-ary SST training trees, file order (default 512)")
    ap.add_argument("--hidden", type=int, default=256, help="h (default 256)")
    ap.add_argument("--embed", type=int, default=128, help="embedding width (default 128)")
    ap.add_argument("--batch-size", type=int, default=64, help="trees per step (default 64)")
    ap.add_argument("--passes", type=int, default=2, help="timed passes per cell process (fastest kept)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the cells (fastest kept)")
    ap.add_argument("--cells", type=cell_names, default=list(CELLS), help=f"comma-separated, of {', '.join(CELLS)}")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    ap.add_argument("--check", action="store_true", help="print Cavs's and DyNet's losses (JSON) and exit")


def degree(g) -> int:
    return int((g.children >= 0).sum(axis=1).max())


def load_trees(count: int, subset: str):
    import cavs
    if subset == "all":
        return cavs.datasets.sst_nary_trees("train", limit=count)
    trees = [g for g in cavs.datasets.sst_nary_trees("train", limit=count * 8) if degree(g) <= 4]
    return trees[:count]


def child_sum_model(arity: int, hidden: int, embed: int, **options):
    import cavs
    from cavs.models.child_sum import model
    return model(arity, hidden, embed, len(cavs.datasets.sst_vocab()) + 1, classes=CLASSES, **options)


# ---------------------------------------------------------------- one cell (in its own process)

def cell(spec: dict) -> dict:
    ftz = environment.ftz_requested()               # $CAVS_FTZ, the harness's setting (default on)
    environment.set_flush_denormals(ftz)            # first, before any framework starts a thread
    launch.pin_threads(1)
    import numpy as np
    import cavs
    from baselines.dynet_child_sum import DynetChildSum
    system, arity, subset, prebuilt = CELLS[spec["cell"]]
    trees = load_trees(spec["trees"], subset)
    bs = spec["batch_size"]
    batches = [trees[i:i + bs] for i in range(0, len(trees) - bs + 1, bs)] or [trees]
    max_deg = max(degree(g) for g in trees)
    arity = arity or max_deg
    model = child_sum_model(arity, spec["hidden"], spec["embed"])
    construct = [0.0]
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
        dynet = DynetChildSum(model.init_params(), batch_size=bs)

        def step(graphs):
            before = dynet.timings.construct_s
            loss = dynet.step(dynet.prepare(graphs))
            construct[0] += dynet.timings.construct_s - before
            return loss
    environment.set_flush_denormals(ftz)                # whatever the system set (DyNet turns it on)
    for graphs in batches if prebuilt else batches[:1]:
        step(graphs)                                    # warm-up, untimed (compiles Cavs's kernels)
    environment.set_flush_denormals(ftz)
    best, best_construct, losses, passes = float("inf"), 0.0, [], []
    for _ in range(spec["passes"]):
        construct[0] = 0.0
        t0 = time.perf_counter()
        losses = [step(g) for g in batches]
        elapsed = time.perf_counter() - t0
        passes.append(round(elapsed, 4))
        if elapsed < best:
            best, best_construct = elapsed, construct[0]
    n = sum(len(b) for b in batches)
    macs = floors.child_sum_macs([g for b in batches for g in b], spec["hidden"], spec["embed"], CLASSES)
    return {"cell": spec["cell"], "system": system, "subset": subset, "trees": n, "arity": arity,
            "max_degree": max_deg, "vertices": int(sum(g.num_vertices for b in batches for g in b)),
            "hidden": spec["hidden"], "embed": spec["embed"], "batch_size": bs, "passes": spec["passes"],
            "best_s": round(best, 4), "pass_s": " ".join(map(str, passes)), "construct_s": round(best_construct, 4),
            "trees_per_s": round(n / best, 2), "first_loss": round(float(losses[0]), 6),
            "last_loss": round(float(np.mean(losses[-1])), 6), "macs": macs, "ftz": ftz, "status": "ok"}


def check(args) -> dict:
    """Cavs and DyNet from the same weights on the same batch: the loss of three SGD steps each."""
    launch.pin_threads(1)
    import cavs
    from baselines.dynet_child_sum import DynetChildSum
    trees = load_trees(args.trees, "all")[:args.batch_size]
    arity = max(degree(g) for g in trees)
    model = child_sum_model(arity, args.hidden, args.embed, seed=3)
    engine = cavs.Engine(model, fusion=False, threads=1)
    dynet = DynetChildSum(dict(engine.params), batch_size=len(trees))
    batch = model.make_batch(trees)
    ours = [engine.step(batch) for _ in range(3)]
    theirs = [dynet.step(dynet.prepare(trees)) for _ in range(3)]
    return {"arity": arity, "trees": len(trees), "cavs": ours, "dynet": theirs}


# ---------------------------------------------------------------- the driver

def measure(name: str, args) -> dict:
    spec = {"cell": name, "trees": args.trees, "hidden": args.hidden, "embed": args.embed,
            "batch_size": args.batch_size, "passes": args.passes}
    return {"cell": name, **launch.run("experiments.studies", ["nary", "--cell", json.dumps(spec)],
                                       time_limit_s=args.timeout)}


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


def main(results_dir: Path, args) -> int:
    if args.check:
        print(json.dumps(check(args)), flush=True)
        return 0
    cells = args.cells
    rates, rev, best = [floors.matmul_rate()], environment.git_revision(), {}
    for round_ in range(args.rounds):
        for name in cells:
            r = {**measure(name, args), "rounds": args.rounds, "git_rev": rev}
            print(f"round {round_ + 1} {name}: {r.get('best_s', '')} s ({r.get('status')})", flush=True)
            launch.keep_fastest(best, name, r, "best_s")
        rates.append(floors.matmul_rate())
    rate = max(rates)        # as the bench study: the floor is never inflated by a slow spell
    rows = [best[c] for c in cells]
    for r in rows:
        if r.get("status") == "ok":
            floor = floors.floor_s(r.pop("macs"), rate)
            r.update(floor_s=round(floor, 6), over_floor=round(r["best_s"] / floor, 3),
                     matmul_gflops=round(rate / 1e9, 2))
    out = launch.write_rows(results_dir / "nary.csv", rows, FIELDS)
    print(table(rows))
    print(floors.rate_summary(rates))
    print(f"wrote {out}")
    return 0
