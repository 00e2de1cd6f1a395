"""The engine's speed against DyNet, TensorFlow, PyTorch by level and the GEMM-bound floor.

    python -m experiments.studies bench [--results DIR] [--hidden 64,256,512] [--repeats 3]
    python -m experiments.studies bench --compare REV_A REV_B --system dynet --workload tree_lstm --h 64

Tree-LSTM: training on the first 512 SST training trees (file order), bs = 64, one thread
(--threads 1,2: each cell at each count), h in 64/256/512: Cavs (default switches, and each switch combination of interest), DyNet with
autobatching and PyTorch by level. Var-LSTM: the first 2048 PTB training sentences, bs = 64,
h = 256: Cavs, DyNet, TensorFlow. Every measurement is a sweep cell in its own process
(launch.file_order_cell: one warm-up batch, then the fastest of `repeats` timed passes), in
`rounds` interleaved rounds (fastest kept). The floor (experiments/floors.py) is the products
the workload needs, each at the fastest library's float32 time on its shape at the cells' thread
count, measured in every round, the fastest kept; the frontier bound is the same work with each
loop task's state matmuls timed on their own (small) shapes: what any frontier-by-frontier system
pays at least.
Prints one table with the ratios; writes DIR/bench.csv (--all-systems: DIR/bench-systems.csv).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .. import arguments, environment, floors, launch

CELL_TIME_LIMIT_S = 1800
ALL_SYSTEMS = {
    "tree_lstm": ("cavs", "cavs-serial", "dynet", "dynet-depth", "fold", "fold-n", "pytorch-levels", "pytorch"),
    "var_lstm": ("cavs", "cavs-serial", "dynet", "dynet-depth", "tensorflow", "cudnn", "pytorch"),
}
CAVS_VARIANTS = {
    "cavs": {},
    "cavs (no fusion)": {"fusion": False},
    "cavs (streaming)": {"streaming": True},    # the eager and lazy phases on a second thread
    "cavs (no lazy, no eager)": {"lazy": False, "eager": False},
}
SYSTEM_LABELS = tuple(dict.fromkeys([*CAVS_VARIANTS, "dynet", "pytorch-levels", "tensorflow",
                                    *ALL_SYSTEMS["tree_lstm"], *ALL_SYSTEMS["var_lstm"]]))   # --systems
TABLE = ["workload", "hidden", "system", "threads", "total_s", "construct_s", "compute_s", "floor_s",
         "frontier_bound_s", "cavs_speedup", "over_floor", "over_frontier_bound", "thread_speedup", "cpu_steal",
         "status"]


def add_arguments(ap) -> None:
    ap.add_argument("--hidden", type=arguments.counts, default=[64, 256, 512], help="Tree-LSTM hidden sizes")
    ap.add_argument("--repeats", type=arguments.count, default=2, help="timed passes per cell (fastest kept)")
    ap.add_argument("--rounds", type=arguments.count, default=3, help="interleaved rounds over the systems")
    ap.add_argument("--threads", type=arguments.counts, default=[1], help="compute threads per cell, e.g. 1,2: every system at each, "
                                                    "in one run (make bench THREADS=2 gives 1,2)")
    ap.add_argument("--variants", default="all", choices=("all", "default"), help="Cavs switch variants: every one or the default only")
    ap.add_argument("--all-systems", action="store_true",
                    help="every system instead of the Cavs variants (writes bench-systems.csv)")
    ap.add_argument("--systems", type=arguments.names(*SYSTEM_LABELS), help="only these systems' cells (comma-separated labels, e.g. cavs,dynet)")
    ap.add_argument("--workloads", type=arguments.names("tree_lstm", "var_lstm"), default=["tree_lstm", "var_lstm"],
                    help="tree_lstm and/or var_lstm")
    ap.add_argument("--native-check", action="store_true",
                    help="first run experiments.native_check (native against Haswell OpenBLAS kernels) and stop "
                         "if the engine's numbers differ; make bench does")
    ap.add_argument("--compare", nargs=2, metavar=("REV_A", "REV_B"),
                    help="time one baseline cell with baselines/ of two git revisions ('worktree': this "
                         "tree), interleaved; prints before/after (use with --system, --workload, --h)")
    ap.add_argument("--system", default="dynet", help="--compare: the system")
    ap.add_argument("--workload", default="tree_lstm", help="--compare: the workload")
    ap.add_argument("--h", type=arguments.count, default=64, help="--compare: the hidden size")
    ap.add_argument("--samples", type=arguments.count, default=512, help="--compare: samples timed (file order, bs 64)")
    ap.add_argument("--leaves", type=arguments.count, default=256, help="--compare: Tree-FC leaves")
    ap.add_argument("--options", default="{}", help="--compare: constructor options (JSON)")


def systems_of(workload: str, args) -> list[tuple[str, str, dict]]:
    """(label, system, constructor options) of the cells measured on `workload`."""
    if args.all_systems:        # every system of the harness
        systems = [(name, name, {}) for name in ALL_SYSTEMS[workload]]
    else:
        variants = CAVS_VARIANTS if args.variants == "all" else {"cavs": {}}
        systems = [(name, "cavs", opts) for name, opts in variants.items()] + [("dynet", "dynet", {})]
        if workload == "tree_lstm":     # the strongest peer a PyTorch user writes by hand
            systems.append(("pytorch-levels", "pytorch-levels", {}))
        if workload == "var_lstm":
            systems.append(("tensorflow", "tensorflow", {}))
    if args.systems:
        systems = [s for s in systems if s[0] in args.systems]
    return systems


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's time over Cavs's (same workload, hidden size and threads), over the floor and the
    bound; and over its own one-thread time (the speedup from more threads)."""
    cavs_s = {(r["workload"], r["hidden"], r["threads"]): r.get("total_s") for r in rows if r["system"] == "cavs"}
    one = {(r["workload"], r["hidden"], r["system"]): r.get("total_s") for r in rows if r["threads"] == 1}
    for r in rows:
        if r.get("total_s") is None:
            continue
        if cavs_s.get((r["workload"], r["hidden"], r["threads"])):
            r["cavs_speedup"] = r["total_s"] / cavs_s[r["workload"], r["hidden"], r["threads"]]   # system / Cavs
        if r["threads"] > 1 and one.get((r["workload"], r["hidden"], r["system"])):
            r["thread_speedup"] = one[r["workload"], r["hidden"], r["system"]] / r["total_s"]
        r["over_floor"] = r["total_s"] / r["floor_s"]
        r["over_frontier_bound"] = r["total_s"] / r["frontier_bound_s"]
    return rows


def yardsticks(workload: str, hidden: int, data, threads: int = 1) -> dict:
    """The floor and the frontier bound of `workload` on `data` (experiments/floors.py): each product
    at the fastest installed library's time on its shape, at `threads`."""
    needed = floors.workload_products(workload, hidden, data)
    state = floors.state_products(needed, workload, hidden)
    frontier = floors.frontier_products(workload, hidden, data)
    timed = floors.time_products(needed + frontier, threads=threads)
    floor = floors.seconds_of(needed, timed)
    bound = floor - floors.seconds_of(state, timed) + floors.seconds_of(frontier, timed)
    won = {}
    for p in needed:
        lib = timed["best"][p][1]
        won[lib] = won.get(lib, 0) + 1
    return {"floor_s": floor, "frontier_bound_s": bound,
            "floor_libraries": " ".join(f"{k}:{v}" for k, v in sorted(won.items()))}


def main(results_dir: Path, args) -> int:
    if args.compare:
        return compare(results_dir, args)
    if args.native_check:     # after the arguments are read: a typo fails at once, not after the check
        from .. import native_check
        checked = native_check.check(results_dir)
        print(native_check.describe(checked), flush=True)
        if not checked.get("equal"):
            return 1
    import cavs
    import pandas as pd

    threads = args.threads
    # this VM's speed drifts by 10% within a run: the yardsticks are measured in every round and
    # the fastest kept, so that the floor and the bound are the least the machine showed it needs,
    # never inflated by a slow spell (which would flatter every system's ratio to them)
    rates = [floors.matmul_rates()]
    measured = []
    jobs = [("tree_lstm", h, 512) for h in args.hidden] + [("var_lstm", 256, 2048)]
    for workload, hidden, count in [j for j in jobs if j[0] in args.workloads]:
        data = cavs.datasets.load_samples(workload, limit=count)
        systems = systems_of(workload, args)
        # rounds interleave the systems, so a slow spell of a shared machine hits all of them;
        # each system keeps its fastest round
        best, sticks = {}, {n: [] for n in threads}
        for _ in range(args.rounds):
            for n in threads:
                sticks[n].append(yardsticks(workload, hidden, data, n))
            for n in threads:
                for label, system, options in systems:
                    t0 = time.perf_counter()
                    cell = launch.file_order_cell(system, workload, hidden, count, options, args.repeats, threads=n)
                    r = launch.run_cell(cell, CELL_TIME_LIMIT_S, results_dir / "logs")
                    print(f"  {workload} h={hidden} {label} threads={n}: {r.get('total_s', float('nan')):.3f} s "
                          f"({r['status']}, {r.get('blas', '?')}; {time.perf_counter() - t0:.0f} s wall, "
                          f"CPU steal {r.get('cpu_steal')})", flush=True)
                    launch.keep_fastest(best, (label, n), {"workload": workload, "hidden": hidden, "samples": count,
                                                            "system": label, "options": json.dumps(options),
                                                            **r, "threads": n})
            rates.append(floors.matmul_rates())
        for n in threads:        # each thread count's rows beside the yardsticks at that count
            least = {k: min(s[k] for s in sticks[n]) for k in ("floor_s", "frontier_bound_s")}
            measured.append(({**sticks[n][-1], **least}, {k: r for k, r in best.items() if k[1] == n}))
    peak, rev = floors.fma_peak(), environment.git_revision()
    fastest = {lib: max(r.get(lib, 0.0) for r in rates) for lib in set().union(*rates)}
    best_rate = max(fastest.values())
    rows = []
    for sticks, best in measured:
        rows += [{**r, **sticks, "best_gemm_gflops": best_rate / 1e9,
                  "best_gemm_library": max(fastest, key=fastest.get),
                  "fma_peak_gflops": peak["peak_gflops"], "clock_ghz": peak["clock_ghz"],
                  "gemm_rates": " ".join(f"{k}:{v / 1e9:.0f}" for k, v in sorted(fastest.items())),
                  "git_rev": rev} for r in best.values()]
    rows = with_ratios(rows)
    launch.write_rows(results_dir / ("bench-systems.csv" if args.all_systems else "bench.csv"), rows)
    share = f"{best_rate / 1e9 / peak['peak_gflops']:.0%}" if peak["peak_gflops"] else "unknown"
    print(f"\nsingle-thread float32 GEMM (2048 x 1024 x 2560), the fastest of {len(rates)} measurements per "
          f"library: " + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in sorted(fastest.items())) + " GFLOP/s")
    print(f"the best, {best_rate / 1e9:.0f} GFLOP/s, is {share} of this core's float32 FMA peak "
          f"({peak['peak_gflops'] or float('nan'):.0f} GFLOP/s = {peak['lanes']} lanes x {peak['fma_pipes']} FMA "
          f"pipes x 2 x {peak['clock_ghz'] or float('nan'):.2f} GHz, the clock {peak['clock_read']})")
    table = pd.DataFrame(rows).reindex(columns=TABLE)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


# ---------------------------------------------------------------- one baseline, two revisions

SNAPSHOT = ("baselines", "cavs")      # what --compare takes from each revision: the systems and the engine


def snapshot_code(rev: str, into: Path) -> Path:
    """`baselines/` and `cavs/` as of git revision `rev` (or this working tree for `rev` =
    "worktree") in a directory of its own; returns that directory."""
    target = into / rev.replace("/", "_")
    target.mkdir(parents=True, exist_ok=True)
    if rev == "worktree":
        for name in SNAPSHOT:
            shutil.copytree(launch.REPO / name, target / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = subprocess.run(["git", "-C", str(launch.REPO), "archive", rev, *SNAPSHOT], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    if not (target / "data").exists():
        (target / "data").symlink_to(launch.REPO / "data")        # the engine reads data/ beside its package
    return target


def compare(results_dir: Path, args) -> int:
    """Before/after of a change to a system or the engine: the same cell with `baselines/` and
    `cavs/` of two revisions (the snapshot's first on the cell's import path, this tree's harness
    after it; before commit 10a3110 only `baselines/` was taken, so engine changes compared equal),
    interleaved round by round (a slow spell of a shared machine hits both), fastest round kept."""
    revs = args.compare
    nan = float("nan")
    cell = launch.file_order_cell(args.system, args.workload, args.h, args.samples, json.loads(args.options),
                                  args.repeats, args.leaves)
    best = {}
    with tempfile.TemporaryDirectory() as tmp:
        roots = {rev: snapshot_code(rev, Path(tmp)) for rev in revs}
        for _ in range(args.rounds):
            for rev in revs:
                r = launch.run_cell(cell, CELL_TIME_LIMIT_S, results_dir / "logs", root=roots[rev])
                print(f"  {args.system} {args.workload} h={args.h} @ {rev}: {r.get('total_s', nan):.3f} s "
                      f"(construct {r.get('construct_s', nan):.3f}, compute {r.get('compute_s', nan):.3f}; "
                      f"{r['status']})", flush=True)
                launch.keep_fastest(best, rev, r)
    print(f"\n{args.system} {args.workload} h={args.h}, {args.samples} samples, bs 64, 1 thread, "
          f"fastest of {args.rounds} interleaved rounds:")
    for rev in revs:
        r = best[rev]
        print(f"{rev:>12}: total {r.get('total_s', nan):.3f} s, construct {r.get('construct_s', nan):.3f} s, "
              f"compute {r.get('compute_s', nan):.3f} s, last loss {r.get('loss', nan):.6f}, {r['status']}")
    a, b = (best[rev] for rev in revs)
    if a["status"] == b["status"] == "ok":
        print(f"  {revs[0]} / {revs[1]}: total {a['total_s'] / b['total_s']:.2f}x, "
              f"compute {a['compute_s'] / b['compute_s']:.2f}x, construct {a['construct_s'] / b['construct_s']:.2f}x")
        return 0
    return 1
