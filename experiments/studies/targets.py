"""The project's speed targets against what this machine's arithmetic allows.

    python -m experiments.studies targets [--results DIR]      # reads DIR/bench.csv and DIR/nary.csv

Each target is a ratio measured within one run (the bench and nary studies). From
the same run's rows it derives the Cavs time the target asks for, and sets it beside the floor of
that run (the products the workload needs, each at the fastest installed library's time on its
shape) and the frontier bound (the same with each loop task's state products timed per task;
experiments/floors.py; both timed at the row's thread count): a target that asks for less than the floor, or the bound, cannot be met by any
implementation of the model on this machine, however little else it spends. `budget_over_floor`
is what is left once Cavs's own graph construction (parsing, levels, schedule: the timed work
outside the products) is taken off, over the floor. Writes DIR/targets.md and prints it.
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..results import read_rows

# (what, file, rows of that file (workload, hidden, threads; or a nary cell), kind, peer or None, goal)
#   kind "lead": peer time / Cavs time >= goal;  "over_bound" / "over_floor": Cavs time / that <= goal;
#   "threads": Cavs's one-thread time / its two-thread time >= goal;  "per_edge": the slowest of the
#   degree sweep's times per edge / the fastest <= goal
TARGETS = [
    ("Var-LSTM h = 256 at least 1.5x faster than TensorFlow", "bench", ("var_lstm", 256, 1), "lead", "tensorflow", 1.5),
    ("Var-LSTM h = 256 at least 2x faster than DyNet", "bench", ("var_lstm", 256, 1), "lead", "dynet", 2.0),
    ("Tree-LSTM h = 64 at least 3x faster than DyNet", "bench", ("tree_lstm", 64, 1), "lead", "dynet", 3.0),
    *[(f"Tree-LSTM h = {h} at least 2x faster than {name}", "bench", ("tree_lstm", h, 1), "lead", peer, 2.0)
      for h in (256, 512) for peer, name in (("dynet", "DyNet"), ("pytorch-levels", "PyTorch by level"))],
    *[(f"Tree-LSTM h = {h} within 1.3x of the frontier bound", "bench", ("tree_lstm", h, 1), "over_bound", None, 1.3)
      for h in (256, 512)],
    ("Tree-LSTM h = 512 at two threads at least 1.6x its one-thread time", "bench", ("tree_lstm", 512, 2), "threads",
     None, 1.6),
    *[(f"Tree-LSTM h = 512 at two threads ahead of {name}", "bench", ("tree_lstm", 512, 2), "lead", peer, 1.0)
      for peer, name in (("dynet", "DyNet"), ("pytorch-levels", "PyTorch by level"))],
    ("child-sum Tree-LSTM on edges at least 2x faster than DyNet", "nary", "cavs", "lead", "dynet", 2.0),
    ("child-sum Tree-LSTM on edges within 1.35x of the floor", "nary", "cavs", "over_floor", None, 1.35),
    ("child-sum on edges: the same time per edge at degrees 4, 32, 256 (within 15%)", "nary", "cavs-deg", "per_edge",
     None, 1.15),
]


def _bench_rows(rows, workload, hidden, threads) -> dict:
    """{system: row} of one workload, hidden size and thread count of bench.csv (ok rows only)."""
    return {r["system"]: r for r in rows if r["workload"] == workload and int(r["hidden"]) == hidden
            and int(r.get("threads") or 1) == threads and r.get("status") == "ok"}


def _nary_rows(rows) -> dict:
    return {r["cell"]: r for r in rows if r.get("status") == "ok"}


def assess(bench: list[dict], nary: list[dict]) -> list[dict]:
    """One row per target: measured, goal, the Cavs time it asks for, and how that compares with
    the floor (and bound) of the same run."""
    out = []
    for what, source, key, kind, peer, goal in TARGETS:
        row = {"target": what, "goal": goal}
        if kind == "per_edge":
            sweep = [r for c, r in _nary_rows(nary).items() if c.startswith(key)]
            if len(sweep) < 2:
                out.append({**row, "verdict": "no measurement (nary.csv lacks the degree sweep)"})
                continue
            per_edge = [float(r["per_edge_us"]) for r in sweep]
            measured = max(per_edge) / min(per_edge)
            out.append({**row, "measured": measured, "git_rev": sweep[0].get("git_rev", ""),
                        "verdict": "met" if measured <= goal else f"not met: {measured:.2f}x between degrees"})
            continue
        if source == "bench":
            by = _bench_rows(bench, *key)
            time_col = "total_s"
        else:
            by = {("cavs" if c == key else c): r for c, r in _nary_rows(nary).items()}
            time_col = "best_s"
        cavs = by.get("cavs")
        one = _bench_rows(bench, key[0], key[1], 1).get("cavs") if kind == "threads" else None
        if cavs is None or (peer and peer not in by) or not cavs.get("floor_s") or (kind == "threads" and one is None):
            out.append({**row, "verdict": f"no measurement ({source}.csv lacks the rows)"})
            continue
        t, floor = float(cavs[time_col]), float(cavs["floor_s"])
        bound = float(cavs["frontier_bound_s"]) if cavs.get("frontier_bound_s") else None
        construct = float(cavs["construct_s"])
        if kind == "lead":
            measured = float(by[peer][time_col]) / t
            met, required = measured >= goal, float(by[peer][time_col]) / goal
        elif kind == "threads":
            measured = float(one[time_col]) / t
            met, required = measured >= goal, float(one[time_col]) / goal
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
    lines = ["| target | measured | Cavs (s) | asks for (s) | floor (s) | frontier bound (s) | "
             "asks / floor | less construction / floor | verdict | commit |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['target']} | {f(r.get('measured'), '.2f')} | {f(r.get('cavs_s'), '.3f')} | "
                     f"{f(r.get('required_s'), '.3f')} | {f(r.get('floor_s'), '.3f')} | {f(r.get('bound_s'), '.3f')} | "
                     f"{f(r.get('required_over_floor'), '.2f')} | {f(r.get('budget_over_floor'), '.2f')} | "
                     f"{r['verdict']} | {r.get('git_rev', '')} |")
    return "\n".join(lines)


def steal_note(files: dict[str, list[dict]]) -> str:
    """A line on the CPU steal under which the files' rows were measured (cpu_steal: the host's
    share of the kept pass's CPU time), so that a verdict from a contended VM reads as one."""
    parts = []
    for name, rows in files.items():
        if not rows:
            continue
        shares = [float(r["cpu_steal"]) for r in rows if r.get("cpu_steal") not in (None, "")]
        parts.append(f"{name}: up to {max(shares):.0%}" if shares else f"{name}: not recorded (rows from before "
                     "the column)")
    return "CPU steal in the timed passes kept (vmstat's `st` over the busy time): " + "; ".join(parts) + "."


def add_arguments(ap) -> None:
    """No options but --results: the directory holding bench.csv and nary.csv."""


def main(results_dir: Path, args) -> int:
    d = results_dir
    bench, nary = read_rows(d / "bench.csv"), read_rows(d / "nary.csv")
    if not bench and not nary:
        print(f"error: neither {d / 'bench.csv'} nor {d / 'nary.csv'} exists; run `make bench` and "
              f"`make nary` first", file=sys.stderr)
        return 2
    text = markdown(assess(bench, nary)) + "\n\n" + steal_note({"bench.csv": bench, "nary.csv": nary})
    (d / "targets.md").write_text(text + "\n")
    print(text)
    print(f"wrote {d / 'targets.md'}")
    return 0
