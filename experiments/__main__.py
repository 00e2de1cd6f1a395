"""`python -m experiments run EXPERIMENT [...]`, `python -m experiments list` and
`python -m experiments results-dir` (the directory a sweep with no --results measures into)."""
from __future__ import annotations

import argparse
import os
import sys

from . import arguments, executors, machine, runner
from .profiles import PROFILES, get_profile
from .registry import EXPERIMENTS, get_experiment


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m experiments",
                                     description="Run the Cavs paper's evaluation sweeps into long-format CSVs.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the experiments, their panels and systems, and the profiles")
    run = sub.add_parser("run", help="run (or resume) one experiment's sweep")
    run.add_argument("experiment", choices=list(EXPERIMENTS))
    run.add_argument("--profile", choices=list(PROFILES),
                     help="how much each cell measures (default: paper where a GPU is present, else cpu)")
    run.add_argument("--systems", type=arguments.items, help="comma-separated subset of the experiment's systems")
    run.add_argument("--panels", type=arguments.items, help="comma-separated subset of the experiment's panels")
    run.add_argument("--results", help="directory of the CSVs (default: results/<this machine's kind>/)")
    run.add_argument("--threads", type=arguments.count, default=1, help="compute threads per cell (default 1)")
    run.add_argument("--time-limit", type=arguments.positive, help="seconds per cell (default: the profile's)")
    run.add_argument("--budget-min", type=arguments.at_least_zero,
                     help="start no cell past this many minutes, 0 = no limit (default: the profile's)")
    run.add_argument("--retry-failed", action="store_true", help="rerun cells recorded as failed or timed out")
    run.add_argument("--dry-run", action="store_true", help="print the cells and an estimated duration only")
    run.add_argument("--no-ftz", action="store_true",
                     help="flush-to-zero and denormals-are-zero off in every system (same as CAVS_FTZ=0)")
    where = sub.add_parser("results-dir", help="print the directory a sweep measures into (see run --results)")
    where.add_argument("--results", help="a directory named by the user: printed as is")
    for p in (run, where):
        p.add_argument("--executor", choices=("local", "ray"),
                       help="where cells run: local (default; one at a time, here) or ray (Ray tasks)")
        p.add_argument("--address", help="with --executor ray: 'auto' (the cluster this machine joined with "
                                         "`ray start`) or ray://host:10001; default: a Ray instance started here")
    return parser, parser.parse_args(argv)


def _executor(parser, args):
    name = args.executor or ("ray" if args.address else "local")
    if name == "local" and args.address:
        parser.error("--address needs --executor ray")
    return executors.make(name, args.address)


def _results_dir(args, executor) -> str:
    """The user's --results, else results/ or results/<kind>/ (the reason goes to stderr)."""
    if args.results:
        return args.results
    kind = executor.kind()
    path, why = machine.default_results_dir(kind)
    print(f"results: {path} ({why})", file=sys.stderr)
    return str(path)


def cmd_list():
    for exp in EXPERIMENTS.values():
        print(f"{exp.name}: {exp.title}")
        for p in exp.panels:
            print(f"  {p.id:<10} {p.workload:<11} {p.vary}={','.join(map(str, p.values))}  "
                  f"systems: {', '.join(p.systems)}" + (f"  variants: {len(p.variants)}" if len(p.variants) > 1 else ""))
    print("profiles:", ", ".join(PROFILES))


def cmd_run(parser, args):
    if args.no_ftz:
        os.environ["CAVS_FTZ"] = "0"      # the cells inherit the runner's environment
    exp = get_experiment(args.experiment)
    unknown = arguments.not_in_experiment(exp, args.systems, args.panels)
    if unknown:
        parser.error(unknown)
    if args.results and os.path.exists(args.results) and not os.path.isdir(args.results):
        parser.error(f"--results {args.results} is a file; give a directory (it is created if missing)")
    if args.dry_run:
        profile = get_profile(args.profile or ("paper" if machine.gpu_present() else "cpu"))
        # every cell, installed or not: the estimate is for the full sweep
        cells = runner.plan(exp, profile, systems=args.systems, panels=args.panels, threads=args.threads,
                            check_available=False).cells
        for panel in exp.panels:
            mine = [c for c in cells if c["panel"] == panel.id]
            print(f"  {panel.id:<10} {len(mine):>4} cells  ~{runner.estimate_s(mine, profile) / 60:5.1f} min")
        print(f"{exp.name}, profile {profile.name}: {len(cells)} cells, "
              f"estimated {runner.estimate_s(cells, profile) / 60:.1f} min (cost model of profiles.py)"
              + (f"; the sweep stops at {profile.sweep_budget_s / 60:.0f} min" if profile.sweep_budget_s else ""))
        return 0
    with _executor(parser, args) as executor:
        profile = get_profile(args.profile or ("paper" if executor.gpu_present() else "cpu"))
        results_dir = _results_dir(args, executor)
        counts = runner.run(exp, profile, results_dir, systems=args.systems, panels=args.panels,
                            threads=args.threads, time_limit_s=args.time_limit, retry_failed=args.retry_failed,
                            budget_s=None if args.budget_min is None else args.budget_min * 60, executor=executor)
    print(f"{exp.name} ({profile.name}) into {results_dir}: " + ", ".join(f"{k}: {v}" for k, v in counts.items()))
    return 0


def cmd_results_dir(parser, args):
    if args.results:
        print(args.results)
        return 0
    with _executor(parser, args) as executor:
        print(_results_dir(args, executor))
    return 0


def main(argv=None):
    parser, args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "list":
        cmd_list()
        return 0
    if args.command == "results-dir":
        return cmd_results_dir(parser, args)
    return cmd_run(parser, args)


if __name__ == "__main__":
    sys.exit(main())
