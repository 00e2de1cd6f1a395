"""The project's speed targets against what this machine's arithmetic allows.

    python -m experiments.studies targets [--results DIR]      # reads DIR/bench.csv and DIR/nary.csv

Each target is a ratio measured within one run (the bench and nary studies). From
the same run's rows it derives the Cavs time the target asks for, and sets it beside the floor of
that run (the products the workload needs at the machine's single-thread GEMM rate) and, for the
Tree-LSTM, the frontier bound (the same with each loop task's state product timed on its own
shape): a target that asks for less than the floor, or the bound, cannot be met by any
implementation of the model on this machine, however little else it spends. `budget_over_floor`
is what is left once Cavs's own graph construction (parsing, levels, schedule: the timed work
outside the products) is taken off, over the floor. Writes DIR/targets.md and prints it.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..results import read_rows

# (issue, what, file, rows of that file (workload, hidden; or nary cell), kind, peer or None, goal)
#   kind "lead": peer time / Cavs time >= goal;  "over_bound" / "over_floor": Cavs time / that <= goal
TARGETS = [
    (15, "Tree-LSTM h = 512 within 1.25x of the frontier bound", "bench", ("tree_lstm", 512), "over_bound", None, 1.25),
    (15, "Tree-LSTM h = 64 at least 4x faster than DyNet", "bench", ("tree_lstm", 64), "lead", "dynet", 4.0),
    (15, "Tree-LSTM h = 64 at least 2x faster than PyTorch by level", "bench", ("tree_lstm", 64), "lead",
     "pytorch-levels", 2.0),
    (15, "Tree-LSTM h = 256 at least 2x faster than PyTorch by level", "bench", ("tree_lstm", 256), "lead",
     "pytorch-levels", 2.0),
    (15, "Tree-LSTM h = 512 at least 2x faster than PyTorch by level", "bench", ("tree_lstm", 512), "lead",
     "pytorch-levels", 2.0),
    (15, "Var-LSTM h = 256 within 1.25x of the GEMM floor", "bench", ("var_lstm", 256), "over_floor", None, 1.25),
    (11, "n-ary child-sum Tree-LSTM at least 2x faster than DyNet", "nary", "all", "lead", "dynet", 2.0),
]


def _bench_rows(rows, workload, hidden) -> dict:
    """{system: row} of one workload and hidden size of bench.csv (ok rows only)."""
    return {r["system"]: r for r in rows if r["workload"] == workload and int(r["hidden"]) == hidden
            and r.get("status") == "ok"}


def _nary_rows(rows, subset) -> dict:
    return {r["system"]: r for r in rows if r.get("subset") == subset and r.get("status") == "ok"
            and r["cell"] in ("cavs", "dynet")}


def assess(bench: list[dict], nary: list[dict]) -> list[dict]:
    """One row per target: measured, goal, the Cavs time it asks for, and how that compares with
    the floor (and bound) of the same run."""
    out = []
    for issue, what, source, key, kind, peer, goal in TARGETS:
        row = {"issue": issue, "target": what, "goal": goal}
        if source == "bench":
            by = _bench_rows(bench, *key)
            time_col, construct_col = "total_s", "construct_s"
        else:
            by = _nary_rows(nary, key)
            time_col, construct_col = "best_s", "construct_s"
        cavs = by.get("cavs")
        if cavs is None or (peer and peer not in by) or not cavs.get("floor_s"):
            out.append({**row, "verdict": f"no measurement ({source}.csv lacks the rows)"})
            continue
        t, floor = float(cavs[time_col]), float(cavs["floor_s"])
        bound = float(cavs["frontier_bound_s"]) if cavs.get("frontier_bound_s") else None
        construct = float(cavs[construct_col])
        if kind == "lead":
            measured = float(by[peer][time_col]) / t
            met, required = measured >= goal, float(by[peer][time_col]) / goal
        else:
            reference = bound if kind == "over_bound" else floor
            measured = t / reference
            met, required = measured <= goal, reference * goal
        limit = max(floor, bound or 0.0)
        if met:
            verdict = "met"
        elif required < floor:
            verdict = "unreachable here: asks for less than the GEMM floor"
        elif bound is not None and required < bound:
            verdict = "unreachable here: asks for less than the frontier bound"
        elif required - construct < limit:
            verdict = "unreachable here unless graph construction is nearly free: with Cavs's, less than the " \
                      + ("frontier bound" if bound is not None and bound > floor else "floor")
        else:
            verdict = f"not met: needs Cavs at {required / floor:.2f}x the floor (now {t / floor:.2f}x)"
        out.append({**row, "measured": measured, "cavs_s": t, "required_s": required, "floor_s": floor,
                    "bound_s": bound, "construct_s": construct, "required_over_floor": required / floor,
                    "budget_over_floor": (required - construct) / floor, "git_rev": cavs.get("git_rev", ""),
                    "verdict": verdict})
    return out


def markdown(rows: list[dict]) -> str:
    def f(v, fmt):
        return "" if v is None else format(v, fmt)
    lines = ["| issue | target | measured | Cavs (s) | asks for (s) | floor (s) | frontier bound (s) | "
             "asks / floor | less construction / floor | verdict | commit |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| #{r['issue']} | {r['target']} | {f(r.get('measured'), '.2f')} | {f(r.get('cavs_s'), '.3f')} | "
                     f"{f(r.get('required_s'), '.3f')} | {f(r.get('floor_s'), '.3f')} | {f(r.get('bound_s'), '.3f')} | "
                     f"{f(r.get('required_over_floor'), '.2f')} | {f(r.get('budget_over_floor'), '.2f')} | "
                     f"{r['verdict']} | {r.get('git_rev', '')} |")
    return "\n".join(lines)


def add_arguments(ap) -> None:
    """No options but --results: the directory holding bench.csv and nary.csv."""


def main(results_dir: Path, args) -> int:
    d = results_dir
    bench, nary = read_rows(d / "bench.csv"), read_rows(d / "nary.csv")
    if not bench and not nary:
        print(f"error: neither {d / 'bench.csv'} nor {d / 'nary.csv'} exists; run `make bench` and "
              f"`make nary` first", file=sys.stderr)
        return 2
    text = markdown(assess(bench, nary))
    (d / "targets.md").write_text(text + "\n")
    print(text)
    print(f"wrote {d / 'targets.md'}")
    return 0
