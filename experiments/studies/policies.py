"""Batching policies compared (scheduler.POLICIES): their tasks and their training time.

    python -m experiments.studies policies [--rounds 3] [--repeats 2] [--policies batched,alap,merged]
                                           [--results DIR]

Workloads as in the bench study: Tree-LSTM h = 512 on the first 512 SST training trees (file
order), and Tree-FC h = 512 (256 leaves) on its first 256 trees; bs = 64, float32, one thread.
Per policy: tasks per batch, mean and median rows per task, the median rows per task that
gathers children (the rows of the loop's state matmul), the share of those tasks under
scheduler.MERGE_MIN_ROWS rows, and the time of one pass over the samples (prepare + step,
scheduling included), measured as the bench study measures Cavs: each in its own process
(launch.file_order_cell: a warm-up batch, the fastest of `repeats` passes), `rounds` rounds
interleaved over the policies, the fastest round kept. Prints the table and which policy is
fastest on each workload (and where every policy made the very same tasks, so that only noise
separates them: Tree-FC's complete trees of one height); writes DIR/policies.csv.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .. import arguments, launch

WORKLOADS = {"tree_lstm": (512, 512), "tree_fc": (512, 256)}      # workload: (hidden, samples)
BATCH = 64          # launch.file_order_cell's batch size
CELL_TIME_LIMIT_S = 1800
TABLE = ["workload", "policy", "tasks_per_batch", "rows_per_task_mean", "rows_per_task_median",
         "loop_rows_per_task_median", "loop_tasks_under_min_rows", "same_tasks_as_batched", "time_s", "construct_s",
         "time_over_batched"]


def task_stats(workload: str, hidden: int, count: int, policy: str) -> dict:
    """Tasks of `policy` over the batches the timed cell runs (file order, bs = 64)."""
    import cavs
    from cavs.scheduler import MERGE_MIN_ROWS
    model = cavs.models.build(workload, hidden=hidden)
    samples = cavs.datasets.load_samples(workload, "train", limit=count)
    sizes, loop_rows, batches, same = [], [], 0, True
    for i in range(0, len(samples) - BATCH + 1, BATCH):
        batch = model.make_batch(samples[i:i + BATCH])
        sched, base = batch.schedule(policy), batch.schedule("batched")
        assert sched.respects_dependencies()
        same &= np.array_equal(sched.order, base.order) and np.array_equal(sched.bounds, base.bounds)
        with_children = (sched.child_rows >= 0).any(axis=1)
        sizes += np.diff(sched.bounds).tolist()
        loop_rows += [r for r in (int(with_children[a:b].sum()) for a, b in sched.tasks()) if r]
        batches += 1
    return {"tasks_per_batch": len(sizes) / batches, "rows_per_task_mean": float(np.mean(sizes)),
            "rows_per_task_median": float(np.median(sizes)),
            "loop_rows_per_task_median": float(np.median(loop_rows)),
            "loop_tasks_under_min_rows": float(np.mean(np.array(loop_rows) < MERGE_MIN_ROWS)),
            "same_tasks_as_batched": bool(same)}


def add_arguments(ap) -> None:
    ap.add_argument("--policies", type=arguments.names("batched", "alap", "merged", "serial"), default=["batched", "alap", "merged"])
    ap.add_argument("--rounds", type=arguments.count, default=3)
    ap.add_argument("--repeats", type=arguments.count, default=2)
    ap.add_argument("--workloads", type=arguments.names(*WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--hidden", type=arguments.count, help="override every workload's hidden size (a smoke run)")
    ap.add_argument("--samples", type=arguments.count, help="override every workload's sample count (a smoke run)")


def main(results_dir: Path, args) -> int:
    import pandas as pd
    policies, workloads = args.policies, args.workloads
    rows = []
    for workload in workloads:
        hidden, count = WORKLOADS[workload]
        hidden, count = args.hidden or hidden, args.samples or count
        stats = {p: task_stats(workload, hidden, count, p) for p in policies}
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for p in policies:
                t0 = time.perf_counter()
                cell = launch.file_order_cell("cavs", workload, hidden, count, {"policy": p}, args.repeats)
                r = launch.run_cell(cell, CELL_TIME_LIMIT_S, results_dir / "logs")
                print(f"  {workload} h={hidden} {p}: {r.get('total_s', float('nan')):.3f} s ({r['status']}, "
                      f"{time.perf_counter() - t0:.0f} s wall)", flush=True)
                launch.keep_fastest(best, p, r)
        batched_s = best.get("batched", {}).get("total_s")
        for p in policies:
            r = best[p]
            row = {"workload": workload, "hidden": hidden, "samples": count, "batch_size": BATCH,
                   "policy": p, **stats[p], "time_s": r.get("total_s"), "construct_s": r.get("construct_s"),
                   "compute_s": r.get("compute_s"), "status": r["status"]}
            if batched_s and r.get("total_s") is not None:
                row["time_over_batched"] = r["total_s"] / batched_s
            rows.append(row)
    launch.write_rows(results_dir / "policies.csv", rows)
    df = pd.DataFrame(rows)
    print(df.reindex(columns=TABLE).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    ok = df[df.status == "ok"]
    fastest = {w: g.loc[g.time_s.idxmin(), "policy"] for w, g in ok.groupby("workload", sort=False)}
    print("fastest:", ", ".join(f"{w}: {p}" for w, p in fastest.items()))
    for w, g in ok.groupby("workload", sort=False):
        if g.same_tasks_as_batched.all():
            print(f"  ({w}: every policy made the same tasks, so its time differences are noise)")
    winner = set(fastest.values())
    if len(winner) == 1 and len(fastest) == len(workloads):
        print(f"{winner.pop()} is fastest on every workload measured")
    else:
        print("no policy is fastest on every workload: the default stays 'batched'")
    return 0 if (df.status == "ok").all() else 1
