"""`make bench-ci`: Cavs's speedup over each reference system, measured side by side in one run (the
`ci` experiment of the registry, `ci` profile), compared with the committed baseline.

    python -m experiments.ci_bench check  --results results/ci   # exit 1 on a regression
    python -m experiments.ci_bench update --results results/ci   # rewrite baseline.json

Speedup = time of the reference / time of Cavs, same workload, same run: ratios survive a shared or
different machine far better than absolute times. A speedup more than `--tolerance` (25%) below the
baseline's is a regression. Systems whose framework is not installed are reported and skipped.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from . import environment, results, runner
from .profiles import get_profile
from .registry import get_experiment

TOLERANCE = 0.25


def measure(results_dir: Path) -> tuple[dict[str, float], list[str]]:
    """Runs the suite afresh; returns {"workload/reference": speedup} and the problems met."""
    run_dir = results_dir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)          # every check measures anew
    runner.run(get_experiment("ci"), get_profile("ci"), run_dir, progress=sys.stderr.isatty())
    rows = results.read_rows(results.csv_path(run_dir, "ci"))
    problems = [f"{r['workload']}/{r['system']}: {r['status']}" for r in rows if r["status"] != "ok"]
    epoch = {(r["workload"], r["system"]): float(r["epoch_s"]) for r in rows if r["status"] == "ok"}
    speedups = {f"{w}/{s}": t / epoch[w, "cavs"] for (w, s), t in epoch.items()
                if s != "cavs" and (w, "cavs") in epoch}
    return speedups, problems


def compare(baseline: dict[str, float], current: dict[str, float], tolerance: float = TOLERANCE):
    """Rows (pair, before, after, after/before, verdict) and whether no speedup regressed."""
    rows, ok = [], True
    for pair in sorted(set(baseline) | set(current)):
        before, after = baseline.get(pair), current.get(pair)
        if before is None:
            verdict, ratio = "new", None
        elif after is None:
            verdict, ratio = "not measured", None
        else:
            ratio = after / before
            verdict = "REGRESSION" if ratio < 1 - tolerance else "ok"
            ok &= verdict == "ok"
        rows.append((pair, before, after, ratio, verdict))
    return rows, ok


def _fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def print_table(rows, out=sys.stdout):
    print(f"{'cavs speedup over':<24} {'before':>8} {'after':>8} {'ratio':>7}  verdict", file=out)
    for pair, before, after, ratio, verdict in rows:
        print(f"{pair:<24} {_fmt(before):>8} {_fmt(after):>8} {_fmt(ratio):>7}  {verdict}", file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.ci_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("check", "update"))
    parser.add_argument("--results", default="results/ci", help="directory of baseline.json and the run")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="allowed relative drop of a speedup (default 0.25)")
    args = parser.parse_args(argv)
    results_dir = Path(args.results)
    baseline_path = results_dir / "baseline.json"
    if args.command == "check" and not baseline_path.exists():
        parser.error(f"no baseline at {baseline_path}; create it with `make bench-ci-update`")

    speedups, problems = measure(results_dir)
    for problem in problems:
        print(f"failed cell: {problem}")
    if not speedups:
        print("no speedup could be measured (did the cavs cells fail?)")
        return 1
    if args.command == "update":
        baseline_path.write_text(json.dumps({
            "speedups": speedups, "git_rev": environment.git_revision(),
            "date": time.strftime("%Y-%m-%d"), "machine": environment.collect(1, "ci")["cpu_model"]},
            indent=2, sort_keys=True) + "\n")
        print_table(compare(speedups, speedups)[0])
        print(f"baseline written to {baseline_path}")
        return 1 if problems else 0
    baseline = json.loads(baseline_path.read_text())["speedups"]
    rows, ok = compare(baseline, speedups, args.tolerance)
    if not ok:
        # a shared machine has slow spells: a real regression survives a second, fresh measurement,
        # so each pair keeps the better of the two runs
        print_table(rows)
        print("bench-ci: a speedup fell; measuring once more to rule out a slow spell of the machine")
        again, more_problems = measure(results_dir)
        problems += more_problems
        speedups = {k: max(v, again.get(k, v)) for k, v in speedups.items()}
        rows, ok = compare(baseline, speedups, args.tolerance)
    print_table(rows)
    ok = ok and not problems
    print("bench-ci: " + ("ok" if ok else f"FAILED (a speedup fell more than {args.tolerance:.0%} or a cell failed)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
