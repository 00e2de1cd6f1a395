"""`make bench-ci`: the engine at HEAD against the engine at the baseline's commit, side by side on this
machine in one run (as `asv continuous base head` does), plus Cavs's speedup over each reference system.

    python -m experiments.ci_bench check   # exit 1 on a regression
    python -m experiments.ci_bench update  # record HEAD's commit, this machine's kind and its speedups

The code check: the baseline names a commit; it is checked out in a git worktree of this clone, and
the `ci` experiment's Cavs cells (Tree-LSTM, Var-LSTM, Tree-FC at h = 128, bs = 64) run from HEAD's
checkout and from the worktree in turn (each cell a fresh process importing its own checkout's harness
and engine), alternating which goes first, for `--rounds` rounds; each side keeps its fastest. HEAD's
Cavs more than `--tolerance` slower than the baseline commit's on any cell is a regression. Both run
on the same machine minutes apart, so neither the CPU generation nor the libraries' fit to it enters.

The cross-system check: Cavs's speedup (reference's time / Cavs's time) over DyNet, PyTorch, Fold and
TensorFlow is measured and printed. Such ratios depend on the CPU as much as on the code (each library's
kernels fit each CPU differently), so they are checked only against a baseline recorded on the same
machine kind (experiments/machine.py, CPU generation included); otherwise they are reported as "no
baseline for this kind". Baselines live at results/<kind>/ci/baseline.json, one per kind; the check
takes this kind's, else the newest of any kind (for its commit). This kind's baseline that cannot be
read, or names no commit, fails the check: skipping it would turn the check off.

If the baseline's commit cannot be checked out (a shallow clone, say), the code check is skipped with
the reason; the speedups are then checked only against a baseline of this kind, and otherwise reported
without failing. A failing check measures once more and keeps each figure's better value: a shared
machine has slow spells, and a real regression survives a second measurement.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from . import arguments, environment, launch, machine, results, runner
from .profiles import get_profile
from .registry import get_experiment

# HEAD's Cavs may be this much slower than the baseline commit's (same machine, interleaved, best of
# the rounds: on the 2-core VMs the two sides of an unchanged engine agree within 1-3%)
TOLERANCE = 0.15
# a cross-system speedup may fall this much below the baseline's (same kind, but another day's run)
SPEEDUP_TOLERANCE = 0.25
ROUNDS = 3
REPO = Path(__file__).resolve().parent.parent
BASELINE = Path("ci") / "baseline.json"          # under a kind's results directory


# ---------------------------------------------------------------- the baseline

def baseline_path(root, kind: dict) -> Path:
    return Path(root) / machine.slug(kind) / BASELINE


def find_baseline(root, ours: dict) -> tuple[Path | None, dict | None, bool]:
    """(path, baseline, recorded on this kind): this kind's baseline, else the newest of any kind."""
    found = []
    for path in sorted(Path(root).glob(f"*/{BASELINE}")):
        try:
            data = read_baseline(path)
        except ValueError as e:
            if path == baseline_path(root, ours):    # this kind's own: ignoring it would turn the check off
                raise
            print(f"bench-ci: {e}; ignored (another kind's)", file=sys.stderr)
            continue
        same = bool(data.get("kind")) and not machine.differences(data["kind"], ours)
        found.append((same, data.get("date", ""), path, data))
    if not found:
        return None, None, False
    same, _, path, data = max(found, key=lambda f: (f[0], f[1]))
    return path, data, same


def read_baseline(path: Path) -> dict:
    """A baseline file's contents; ValueError naming the file when it cannot be one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(data, dict) or not baseline_commit(data):
        raise ValueError(f"{path} records no commit, so HEAD's engine has nothing to be compared with")
    return data


def baseline_commit(data: dict) -> str | None:
    rev = data.get("commit") or data.get("git_rev") or ""
    return rev.removesuffix("-dirty") or None


# ---------------------------------------------------------------- the baseline commit's checkout

def _git(*args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True)


@contextmanager
def worktree(commit: str):
    """Yields (checkout of `commit`, None) or (None, why it cannot be checked out)."""
    found = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if found.returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"
        yield None, f"commit {commit} is not in this clone" + (" (a shallow clone)" if shallow else "")
        return
    where = Path(tempfile.mkdtemp(prefix="cavs-ci-base-")) / "checkout"
    added = _git("worktree", "add", "--detach", "--quiet", str(where), found.stdout.strip())
    if added.returncode != 0:
        shutil.rmtree(where.parent, ignore_errors=True)
        yield None, f"git worktree add {commit} failed: {added.stderr.strip()[:200]}"
        return
    try:
        probe = subprocess.run([sys.executable, "-c", "import cavs, experiments.cell; print(cavs.__file__)"],
                               cwd=where, env=launch.env(1, where, native_blas=False), capture_output=True,
                               text=True)
        imported = Path(probe.stdout.strip() or ".").resolve()
        if probe.returncode != 0 or where.resolve() not in imported.parents:
            yield None, (f"the checkout of {commit} does not import its own engine "
                         f"({probe.stdout.strip() or probe.stderr.strip()[-200:]})")
        else:
            yield where, None
    finally:
        _git("worktree", "remove", "--force", str(where))
        shutil.rmtree(where.parent, ignore_errors=True)
        _git("worktree", "prune")


# ---------------------------------------------------------------- measuring

def suite(systems=None, workloads=None) -> list[dict]:
    """The `ci` experiment's cells here (systems not installed are left out), Cavs's first."""
    cells = runner.plan(get_experiment("ci"), get_profile("ci")).cells
    cells = [c for c in cells if (workloads is None or c["workload"] in workloads)
             and (c["system"] == "cavs" or systems is None or c["system"] in systems)]
    return sorted(cells, key=lambda c: c["system"] != "cavs")


def _run(cell: dict, run_dir: Path, side: str, root: Path | None = None) -> dict:
    result = launch.run_cell(cell, get_profile("ci").time_limit_s, run_dir / f"logs-{side}", root, native_blas=False)
    results.append_row(run_dir / f"{side}.csv", {**{k: v for k, v in cell.items() if k in results.COLUMNS},
                                                 **{k: v for k, v in result.items() if k in results.COLUMNS},
                                                 "options": json.dumps(cell["options"]),
                                                 "cell_id": f"{cell['cell_id']}-{time.monotonic_ns()}"})
    return result


def _keep_best(best: dict, key, result: dict, problems: list, what: str):
    if result.get("status") != "ok":
        problems.append(f"{what}: {result.get('status')}")
        return
    best[key] = min(best.get(key, float("inf")), float(result["epoch_s"]))


def measure(cells: list[dict], run_dir: Path, base: Path | None, rounds: int, first_round: int = 0) -> dict:
    """{"head": {workload: s}, "base": {workload: s}, "reference": {(workload, system): s},
    "problems": [...]}: Cavs at HEAD and at `base`, interleaved over `rounds` (alternating which side
    goes first, HEAD in even rounds counted from `first_round`), each side's fastest; every reference
    system once. Every cell keeps its fastest pass of the `ci` profile's (at least 3, and 1 s of them)."""
    out = {"head": {}, "base": {}, "reference": {}, "problems": [], "pairs": {}}
    cavs = [c for c in cells if c["system"] == "cavs"]
    for r in range(first_round, first_round + rounds):
        for cell in cavs:
            sides = ["head", "base"] if base is not None else ["head"]
            pair = {}
            for side in sides if r % 2 == 0 else sides[::-1]:
                result = _run(cell, run_dir, side, base if side == "base" else None)
                _keep_best(out[side], cell["workload"], result, out["problems"], f"{cell['workload']}/cavs ({side})")
                if result.get("status") == "ok":
                    pair[side] = float(result["epoch_s"])
            if len(pair) == 2:          # the two sides minutes apart: a slow spell of the VM hits both
                out["pairs"].setdefault(cell["workload"], []).append(pair["head"] / pair["base"])
    for cell in cells:
        if cell["system"] != "cavs":
            result = _run(cell, run_dir, "head")
            _keep_best(out["reference"], (cell["workload"], cell["system"]), result, out["problems"],
                       f"{cell['workload']}/{cell['system']}")
    return out


def merge(a: dict, b: dict) -> dict:
    """Each figure's better (lower) time of two measurements."""
    out = {"problems": a["problems"] + b["problems"]}
    out["pairs"] = {w: a.get("pairs", {}).get(w, []) + b.get("pairs", {}).get(w, [])
                    for w in set(a.get("pairs", {})) | set(b.get("pairs", {}))}
    for part in ("head", "base", "reference"):
        keys = set(a[part]) | set(b[part])
        out[part] = {k: min(a[part].get(k, float("inf")), b[part].get(k, float("inf"))) for k in keys}
    return out


def speedups(m: dict) -> dict[str, float]:
    """{"workload/reference": reference time / HEAD's Cavs time}."""
    return {f"{w}/{s}": t / m["head"][w] for (w, s), t in m["reference"].items() if w in m["head"]}


# ---------------------------------------------------------------- verdicts

def compare_code(m: dict, tolerance: float = TOLERANCE):
    """Rows (workload, base s, head s, head/base, verdict, median paired head/base) and whether HEAD
    is nowhere slower than allowed. A regression is HEAD past the tolerance both in its best time
    against the base's best and in the median of the rounds' paired ratios (each round's two runs
    minutes apart): one lucky pass of either side moves the first alone. On the Intel VM, an
    unchanged engine read 1.18x by the first (the base's best 116.5 s against HEAD's six runs of
    137.8 s and more), while four runs interleaved an hour later read 129.7-145.7 s against
    130.0-134.2 s."""
    rows, ok = [], True
    for w in sorted(set(m["head"]) | set(m["base"])):
        base, head = m["base"].get(w), m["head"].get(w)
        pairs = m.get("pairs", {}).get(w)
        paired = statistics.median(pairs) if pairs else None
        if base is None or head is None:
            rows.append((w, base, head, None, "not measured", paired))
            ok = False
            continue
        ratio = head / base
        verdict = "REGRESSION" if min(ratio, paired or ratio) > 1 + tolerance else "ok"
        ok &= verdict == "ok"
        rows.append((w, base, head, ratio, verdict, paired))
    return rows, ok


def compare(baseline: dict[str, float], current: dict[str, float], tolerance: float = SPEEDUP_TOLERANCE):
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


def print_code_table(rows, out=sys.stdout):
    print(f"{'cavs epoch (s)':<24} {'base':>8} {'head':>8} {'head/base':>9} {'paired':>7}  verdict", file=out)
    for w, base, head, ratio, verdict, paired in rows:
        print(f"{w:<24} {_fmt(base, '.3f'):>8} {_fmt(head, '.3f'):>8} {_fmt(ratio):>9} {_fmt(paired):>7}  {verdict}",
              file=out)


def print_table(rows, out=sys.stdout, checked: bool = True):
    print(f"{'cavs speedup over':<24} {'before':>8} {'after':>8} {'ratio':>7}  verdict", file=out)
    for pair, before, after, ratio, verdict in rows:
        verdict = verdict if checked else "reported (no baseline for this kind)"
        print(f"{pair:<24} {_fmt(before):>8} {_fmt(after):>8} {_fmt(ratio):>7}  {verdict}", file=out)


def verdict(m: dict, baseline: dict | None, same_kind: bool, code: bool, args):
    """(ok, code rows or None, speedup rows, speedups checked)."""
    code_rows, code_ok = compare_code(m, args.tolerance) if code else (None, True)
    checked = same_kind and baseline is not None
    rows, speed_ok = compare(baseline.get("speedups", {}) if checked else {}, speedups(m), args.speedup_tolerance)
    ok = code_ok and (speed_ok or not checked) and not m["problems"]
    return ok, code_rows, rows, checked


# ---------------------------------------------------------------- the commands

def check(args, ours: dict) -> int:
    try:
        path, baseline, same_kind = (Path(args.baseline), read_baseline(args.baseline), True) \
            if args.baseline else find_baseline(args.root, ours)
    except ValueError as e:
        print(f"bench-ci: {e}; record it again with `make bench-ci-update`")
        return 1
    if args.baseline:
        same_kind = bool(baseline.get("kind")) and not machine.differences(baseline["kind"], ours)
    if baseline is None:
        print(f"bench-ci: no baseline under {args.root}/*/{BASELINE}; record one with `make bench-ci-update`")
        return 1
    commit = baseline_commit(baseline)
    recorded = machine.label(baseline["kind"]) if baseline.get("kind") else baseline.get("machine", "?")
    print(f"bench-ci: baseline {path} (commit {commit}, recorded on {recorded})")
    print(f"bench-ci: this machine: {machine.label(ours)}; HEAD: {environment.git_revision()}")
    cells = suite(args.systems, args.workloads)
    run_dir = Path(args.root) / machine.slug(ours) / "ci" / "run"
    shutil.rmtree(run_dir, ignore_errors=True)          # every check measures anew
    with worktree(commit) as (base, why):
        if base is None:
            print(f"bench-ci: the engine cannot be compared with its baseline commit: {why}")
            if not same_kind:
                print("bench-ci: and the baseline was recorded on another kind of machine: reporting only")
        m = measure(cells, run_dir, base, args.rounds)
        ok, code_rows, rows, checked = verdict(m, baseline, same_kind, base is not None, args)
        if not ok:
            if code_rows:
                print_code_table(code_rows)
            print_table(rows, checked=checked)
            print("bench-ci: a figure fell; measuring once more to rule out a slow spell of the machine")
            # the rounds go on where the first measurement stopped: with an odd number of rounds the
            # side that went first now goes second, so neither side always takes the first slot
            # (one round each, on an unchanged tree, read HEAD 1.37x and 1.21x slower from that slot)
            m = merge(m, measure(cells, run_dir, base, args.rounds, first_round=args.rounds))
            ok, code_rows, rows, checked = verdict(m, baseline, same_kind, base is not None, args)
    for problem in m["problems"]:
        print(f"failed cell: {problem}")
    if code_rows is not None:
        print(f"HEAD's engine against commit {commit}'s, same machine, interleaved: best of each side's runs, "
              "and the median of the rounds' paired ratios:")
        print_code_table(code_rows)
    print("Cavs's speedups in this run" + (f" against the baseline of this kind ({path}):" if checked
                                           else " (no baseline for this kind: reported, not checked):"))
    print_table(rows, checked=checked)
    if base is None and not same_kind:
        print("bench-ci: ok (nothing to check against on this machine: reported only)")
        return 0
    print("bench-ci: " + ("ok" if ok else f"FAILED (the engine slowed by more than {args.tolerance:.0%}, a speedup "
                                          f"fell by more than {args.speedup_tolerance:.0%}, or a cell failed)"))
    return 0 if ok else 1


def update(args, ours: dict) -> int:
    rev = environment.git_revision()
    commit = _git("rev-parse", "HEAD").stdout.strip()
    if rev.endswith("-dirty"):
        print(f"bench-ci: warning: the tree has uncommitted changes; the baseline names {rev} and its "
              "commit's code is not what was measured", file=sys.stderr)
    run_dir = Path(args.root) / machine.slug(ours) / "ci" / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    m = measure(suite(args.systems, args.workloads), run_dir, None, args.rounds)
    for problem in m["problems"]:
        print(f"failed cell: {problem}")
    if not m["head"]:
        print("no Cavs cell could be measured")
        return 1
    path = baseline_path(args.root, ours)
    path.parent.mkdir(parents=True, exist_ok=True)
    found = speedups(m)
    path.write_text(json.dumps({
        "commit": commit, "git_rev": rev, "kind": ours, "machine": machine.label(ours),
        "date": time.strftime("%Y-%m-%d %H:%M"), "speedups": found,
        "cavs_epoch_s": m["head"], "rounds": args.rounds,
        "how": "experiments.ci_bench update: the ci experiment's cells, Cavs best of the rounds, each reference "
               "system once (its best of the ci profile's repeats)"}, indent=2, sort_keys=True) + "\n")
    print_table(compare(found, found)[0])
    print(f"baseline written to {path}")
    return 1 if m["problems"] else 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.ci_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("check", "update"))
    parser.add_argument("--root", default=machine.ROOT, help="the results root holding <kind>/ci/baseline.json")
    parser.add_argument("--baseline", help="a baseline.json to use instead of the one found under --root")
    parser.add_argument("--tolerance", type=arguments.at_least_zero, default=TOLERANCE,
                        help=f"allowed slow-down of HEAD's engine against the baseline commit's (default {TOLERANCE})")
    parser.add_argument("--speedup-tolerance", type=arguments.at_least_zero, default=SPEEDUP_TOLERANCE,
                        help=f"allowed drop of a cross-system speedup, same kind only (default {SPEEDUP_TOLERANCE})")
    parser.add_argument("--rounds", type=arguments.count, default=ROUNDS, help="interleaved rounds of the Cavs cells (default 3)")
    ci = get_experiment("ci")
    parser.add_argument("--workloads", type=arguments.names(*dict.fromkeys(p.workload for p in ci.panels)),
                        help="comma-separated subset of the suite's workloads")
    parser.add_argument("--systems", type=arguments.names("none", *(s for s in ci.systems if s != "cavs")),
                        help="comma-separated subset of the reference systems ('none': Cavs only)")
    args = parser.parse_args(argv)
    ours = machine.kind()
    return check(args, ours) if args.command == "check" else update(args, ours)


if __name__ == "__main__":
    sys.exit(main())
