"""`make gpu-check`: the first run on a GPU machine, in one command that fits its device time.

    python3 -m experiments.gpu_check --dry-run             # the plan and its estimate; needs no GPU
    python3 -m experiments.gpu_check --results results/gpu # the tests, then the sweep
    python3 -m experiments.gpu_check --results results/gpu --where   # the directory it measures into

Runs with the machine's own `python3` (CuPy, PyTorch, Numba, pandas, matplotlib, pytest; no DyNet,
TensorFlow or Ray, no .venv), and never stops at the first failure:

1. the CuPy tests, tests/engine/test_gpu.py (CuPy against NumPy: every expression template as a CUDA
   kernel, fused kernel counts, every model of cavs.models under every switch combination, float32,
   training steps), into DIR/tests.xml (JUnit) and DIR/tests.log; after TEST_BUDGET_S the remaining
   tests are skipped (CAVS_GPU_TEST_DEADLINE), and pytest is stopped TEST_KILL_S later at the latest;
2. a sweep in the `gpu-check` profile: Figure 8's panels a, d and h (cavs, cavs-serial, cudnn,
   pytorch-levels, fold) into DIR/fig8.csv and the ablation on the Tree-LSTM into DIR/ablation.csv,
   with DIR/environment.json; the grid (batch sizes, hidden sizes) is the largest of GRIDS whose
   estimate (profiles.py's GPU model: guesses, marked so) keeps the whole command within PLAN_S, and
   the runner's budget stops starting cells when the device time runs out (DEVICE_BUDGET_S, less the
   plots' reserve); each cell's wall time goes to DIR/cell_walltimes.csv next to its estimate;
3. DIR/gpu_check.json and DIR/gpu_check.md: what ran, what passed, estimates against wall times.

The Makefile then draws DIR/figures/fig8.png and ablation.png (`python3 -m plots`). Exit status: 0
when every test passed and every planned cell was measured ok, 1 otherwise (the files are written
either way). Where a pure-Python helper the harness imports is missing (tqdm, threadpoolctl), a
minimal stand-in module is put on the path for this run and recorded; DyNet, TensorFlow and Ray are
never imported (the runner skips systems whose framework is missing or cannot run on a GPU).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from . import arguments, executors, launch, machine
from .profiles import GPU_FIRST_COMPILE_S, GPU_VARIANT_COMPILE_S, GPU_WARM_COMPILE_S, get_profile, gpu_compile_s
from .registry import BATCH_SIZES, HIDDENS, SYSTEM_FACTS, get_experiment

REPO = Path(__file__).resolve().parent.parent
PROFILE = "gpu-check"
DEVICE_BUDGET_S = 8 * 60        # the whole `make gpu-check`, plots included
PLAN_S = 6 * 60                 # its estimate may be at most this (the rest is margin for the guesses)
TEST_BUDGET_S = 150             # test_gpu.py's tests start until then, the rest are skipped ...
TEST_KILL_S = 40                # ... and pytest is stopped this much later at the latest
TEST_ESTIMATE_S = 110           # guess: imports, CUDA start, ~200 small tests, ~300 NVRTC compiles of ~0.25 s
                                # (CuPy compiles a kernel per dtype, dimensions and contiguity of its arguments)
PLOT_RESERVE_S = 20             # the Makefile's two `python3 -m plots` after this script (~5-8 s each)
CELL_OVERRUN_S = 55             # a started cell may run this much past its estimate (its limit: 60 s)
TEST_FILE = "tests/engine/test_gpu.py"
DEADLINE_ENV = "CAVS_GPU_TEST_DEADLINE"
FIG8_PANELS = ("a", "d", "h")
SYSTEMS = ("cavs", "cavs-serial", "cudnn", "pytorch-levels", "fold")
ABLATION_PANELS = ("tree_lstm",)
# (batch sizes of panels a and d, hidden sizes of panel h), largest first: the first that fits is run
GRIDS = (
    (BATCH_SIZES, HIDDENS),
    ((1, 4, 16, 64, 256), (64, 256, 1024)),
    ((1, 8, 64, 256), (64, 256, 1024)),
    ((1, 16, 256), (64, 256, 1024)),
    ((1, 16, 256), (64, 1024)),
    ((1, 64), (64, 512)),
)
# what the harness imports that a GPU machine's Python may lack, with a minimal stand-in
SHIMS = {
    "tqdm": '''"""Stand-in for tqdm (experiments/gpu_check.py): no progress bar."""
class tqdm:
    def __init__(self, iterable=None, *args, **kwargs):
        self.iterable = iterable
    def __iter__(self):
        return iter(self.iterable or ())
    def update(self, n=1):
        pass
    def set_postfix_str(self, *args, **kwargs):
        pass
    def set_description(self, *args, **kwargs):
        pass
    def close(self):
        pass
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
''',
    "threadpoolctl": '''"""Stand-in for threadpoolctl (experiments/gpu_check.py): reports no pools, limits nothing
(the cells' CPU thread variables are still set by experiments/launch.py)."""
def threadpool_info():
    return []
class threadpool_limits:
    def __init__(self, limits=None, user_api=None):
        pass
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
    def restore_original_limits(self):
        pass
    unregister = restore_original_limits
''',
}
# frameworks that are not on the GPU machine; nothing on gpu-check's path may need them
ABSENT_THERE = ("dynet", "tensorflow", "ray")
MODULES = ("cupy", "cupyx", "torch", "numba", "numpy", "pandas", "matplotlib", "pytest", "tqdm", "threadpoolctl",
           "dynet", "tensorflow", "ray")


# ---------------------------------------------------------------- the plan

ABLATION_AT = None              # (bs, h) of the ablation's cells; None: the registry's (bs = 64, h = 512)


def experiments(grid) -> tuple:
    """(fig8, ablation): the registry's experiments cut to gpu-check's panels, systems and grid."""
    batch_sizes, hiddens = grid
    fig8 = get_experiment("fig8")
    panels = []
    for p in fig8.panels:
        if p.id not in FIG8_PANELS:
            continue
        values = batch_sizes if p.vary == "batch_size" else hiddens
        panels.append(dataclasses.replace(p, systems=tuple(s for s in p.systems if s in SYSTEMS), values=values))
    ablation = get_experiment("ablation")
    # token sharing is a NumPy path (cavs/tokens.py): on CuPy its variant would be all-off again
    cut = [dataclasses.replace(p, variants=tuple(v for v in p.variants if v[0] != "share_tokens"))
           for p in ablation.panels if p.id in ABLATION_PANELS]
    if ABLATION_AT is not None:
        cut = [dataclasses.replace(p, values=(ABLATION_AT[0],), hidden=ABLATION_AT[1]) for p in cut]
    return dataclasses.replace(fig8, panels=tuple(panels)), dataclasses.replace(ablation, panels=tuple(cut))


def cells_of(experiment, profile, check_available: bool = False) -> tuple[list[dict], dict]:
    from . import runner          # (imports tqdm: after the shims)
    p = runner.plan(experiment, profile, systems=list(SYSTEMS), device="cuda", check_available=check_available)
    return p.cells, p.skipped


def estimate(grid, tests: bool = True) -> dict:
    """The cost model's seconds of one grid: tests, each experiment, compilation, plots."""
    from . import runner
    profile = get_profile(PROFILE)
    out = {"grid": {"batch_sizes": list(grid[0]), "hiddens": list(grid[1])}, "tests_s": TEST_ESTIMATE_S if tests else 0,
           "plots_s": PLOT_RESERVE_S, "experiments": {}}
    everything = []
    for exp in experiments(grid):
        cells, _ = cells_of(exp, profile)
        everything += cells
        out["experiments"][exp.name] = {
            "cells": len(cells), "s": runner.estimate_s(cells, profile),
            "panels": {p.id: {"cells": sum(c["panel"] == p.id for c in cells),
                              "s": runner.estimate_s([c for c in cells if c["panel"] == p.id], profile)}
                       for p in exp.panels}}
    out["compile_s"] = gpu_compile_s(everything, warm=tests)
    out["sweep_s"] = sum(e["s"] for e in out["experiments"].values()) + out["compile_s"]
    out["total_s"] = out["tests_s"] + out["sweep_s"] + out["plots_s"]
    return out


def choose(plan_s: float = PLAN_S, tests: bool = True) -> dict:
    """The largest grid whose whole estimate is at most plan_s (the smallest one otherwise)."""
    for grid in GRIDS:
        est = estimate(grid, tests)
        if est["total_s"] <= plan_s:
            return est
    return est


# ---------------------------------------------------------------- the environment

def install_shims(where: Path | None = None) -> list[str]:
    """Stand-ins for the missing pure-Python helpers, first on this process's path and on its
    children's (PYTHONPATH). Returns their names."""
    missing = [name for name in SHIMS if importlib.util.find_spec(name) is None]
    if not missing:
        return []
    where = Path(where or tempfile.mkdtemp(prefix="cavs-gpu-check-shims-"))
    where.mkdir(parents=True, exist_ok=True)
    for name in missing:
        (where / f"{name}.py").write_text(SHIMS[name])
        if name in sys.modules and sys.modules[name] is None:      # marked absent: the stand-in replaces it
            del sys.modules[name]
    sys.path.insert(0, str(where))
    importlib.invalidate_caches()
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where), os.environ.get("PYTHONPATH")]))
    return missing


def found_modules() -> dict:
    out = {}
    for name in MODULES:
        try:
            out[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            out[name] = False
    return out


def gpu_facts() -> dict:
    """The device as CuPy sees it (imports CuPy: only in a real run)."""
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
        props = cupy.cuda.runtime.getDeviceProperties(0) if count else {}
        name = props.get("name", b"")
        return {"cupy": cupy.__version__, "devices": count,
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "compute_capability": cupy.cuda.Device(0).compute_capability if count else None,
                "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
                "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
                "memory_gib": round(props.get("totalGlobalMem", 0) / 2**30, 1)}
    except Exception as exc:          # no CuPy, no driver, no device: say so, go on
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def results_dir(requested) -> Path:
    """`requested`, or requested/<this kind> where it holds another machine kind's results."""
    requested = Path(requested)
    kind = machine.kind()
    if machine.mismatch(requested, kind):
        return requested / machine.slug(kind)
    return requested


# ---------------------------------------------------------------- step 1: the tests

def pytest_command(junit: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
    if junit is not None:
        cmd.append(f"--junitxml={junit}")
    return cmd + [TEST_FILE]


def junit_counts(path: Path) -> dict:
    """{tests, passed, failed, errors, skipped} of a JUnit file, and the failed tests' names."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: 0 for k in ("tests", "failed", "errors", "skipped")}
    failed = []
    for suite in suites:
        for case in suite.iter("testcase"):
            counts["tests"] += 1
            kinds = {child.tag for child in case}
            if "failure" in kinds:
                counts["failed"] += 1
                failed.append(case.get("name"))
            elif "error" in kinds:
                counts["errors"] += 1
                failed.append(case.get("name"))
            elif "skipped" in kinds:
                counts["skipped"] += 1
    counts["passed"] = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    counts["not_passed"] = failed[:50]
    return counts


def run_tests(out: Path, budget_s: float) -> dict:
    junit, log = out / "tests.xml", out / "tests.log"
    junit.unlink(missing_ok=True)
    env = dict(os.environ, **{DEADLINE_ENV: str(time.time() + budget_s)})
    t0 = time.monotonic()
    status = "ok"
    with open(log, "w") as f:
        try:
            proc = subprocess.run(pytest_command(junit), cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=budget_s + TEST_KILL_S)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code, status = None, "stopped: past its time limit (no JUnit file; see tests.log)"
    record = {"command": " ".join(pytest_command(junit)), "wall_s": round(time.monotonic() - t0, 1),
              "exit_code": code, "status": status, "log": str(log)}
    if junit.exists():
        try:
            record.update(junit_counts(junit))
        except ET.ParseError as exc:
            record["status"] = f"unreadable JUnit file: {exc}"
    if code not in (0, None) and record.get("tests", 0) == 0:
        record["status"] = f"pytest exited {code} before running tests (see tests.log)"
    return record


# ---------------------------------------------------------------- step 2: the sweep

class TimedExecutor(executors.LocalExecutor):
    """The local executor, recording each cell's wall time (start-up included) next to its estimate."""

    def __init__(self, path: Path):
        self.path = path

    def run(self, cells, limit_s, log_dir, may_start):
        from . import runner
        profile = get_profile(PROFILE)
        ours = machine.label(machine.kind())
        for cell in cells:
            if not may_start(cell):
                return
            t0 = time.monotonic()
            result = launch.run_cell(cell, limit_s, log_dir)
            wall = time.monotonic() - t0
            new = not self.path.exists()
            with open(self.path, "a") as f:
                if new:
                    f.write("experiment,panel,system,workload,variant,batch_size,hidden,status,wall_s,estimate_s,cell_id\n")
                f.write(",".join(str(x) for x in (
                    cell["experiment"], cell["panel"], cell["system"], cell["workload"], cell["variant"],
                    cell["batch_size"], cell["hidden"], result.get("status", "?").split(":")[0], round(wall, 2),
                    round(runner.estimate_s([cell], profile), 2), cell["cell_id"])) + "\n")
            yield cell, {**result, "node": machine.node(), "machine": ours}


def run_sweep(out: Path, grid, deadline: float) -> dict:
    """Both experiments, fig8 first with the ablation's estimate kept back for it."""
    from . import runner
    profile = get_profile(PROFILE)
    exps = experiments(grid)
    record = {}
    reserve = {e.name: runner.estimate_s(cells_of(e, profile)[0], profile) for e in exps}
    for k, exp in enumerate(exps):
        later = sum(reserve[e.name] for e in exps[k + 1:])
        budget = deadline - time.monotonic() - later - CELL_OVERRUN_S
        t0 = time.monotonic()
        if budget <= 0:
            record[exp.name] = {"status": "not started: no device time left", "budget_s": round(budget, 1)}
            continue
        try:
            counts = runner.run(exp, profile, out, systems=list(SYSTEMS), budget_s=budget,
                                time_limit_s=profile.time_limit_s, progress=False,
                                executor=TimedExecutor(out / "cell_walltimes.csv"))
            status = "ok"
        except SystemExit as exc:          # the runner refuses (another machine's results, a running sweep)
            counts, status = {}, f"refused: {exc}"
        except Exception as exc:           # a harness failure: recorded, the rest goes on
            counts, status = {}, f"failed: {type(exc).__name__}: {exc}"[:300]
        record[exp.name] = {"status": status, "counts": counts, "budget_s": round(budget, 1),
                            "wall_s": round(time.monotonic() - t0, 1), "estimate_s": round(reserve[exp.name], 1)}
        print(f"{exp.name} into {out}: {status}; " + ", ".join(f"{k}: {v}" for k, v in counts.items()), flush=True)
    return record


# ---------------------------------------------------------------- the report

def write_report(out: Path, record: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    t = record.get("tests", {})
    lines = ["# make gpu-check", "", f"Machine: {record.get('machine')}", f"GPU: {record.get('gpu')}",
             f"Grid: batch sizes {record['plan']['grid']['batch_sizes']}, hidden sizes {record['plan']['grid']['hiddens']}",
             f"Estimated {record['plan']['total_s'] / 60:.1f} min; took {record.get('wall_s', 0) / 60:.1f} min "
             f"(this script; the plots follow).", "",
             "## Tests (tests/engine/test_gpu.py)", "",
             f"{t.get('passed', '?')} passed, {t.get('failed', '?')} failed, {t.get('errors', '?')} errors, "
             f"{t.get('skipped', '?')} skipped of {t.get('tests', '?')}; {t.get('status')}; {t.get('wall_s')} s "
             f"(estimated {TEST_ESTIMATE_S} s). JUnit: tests.xml, output: tests.log.", ""]
    for name in t.get("not_passed", []):
        lines.append(f"- not passed: `{name}`")
    lines += ["", "## Sweep (profile gpu-check)", ""]
    for name, r in record.get("sweep", {}).items():
        counts = ", ".join(f"{k}: {v}" for k, v in r.get("counts", {}).items())
        lines.append(f"- {name}: {r['status']}; {counts}; {r.get('wall_s', 0)} s (estimated "
                     f"{r.get('estimate_s', 0)} s, budget {r.get('budget_s')} s)")
    lines += ["", "Each cell's wall time against the GPU model's guess: cell_walltimes.csv (to calibrate "
              "experiments/profiles.py's GPU_* guesses).", ""]
    if record.get("shims"):
        lines.append(f"Stand-ins used for missing helpers: {', '.join(record['shims'])} (no progress bar, no "
                     f"thread-pool control).")
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- dry run

def print_plan(plan: dict, requested: str, here: dict) -> None:
    print("make gpu-check: the plan (nothing runs; no GPU needed)")
    print(f"  python: {sys.executable} {sys.version.split()[0]}")
    print("  modules here: " + ", ".join(f"{m} {'yes' if ok else 'no'}" for m, ok in here.items()))
    missing = [n for n in SHIMS if not here.get(n)]
    if missing:
        print(f"  missing helpers, replaced by stand-ins in a real run: {', '.join(missing)}")
    print(f"  never imported on this path: {', '.join(ABSENT_THERE)} (their systems are skipped: "
          + ", ".join(s for s, f in SYSTEM_FACTS.items() if f[0] in ABSENT_THERE or not f[1]) + ")")
    try:
        out = subprocess.run(pytest_command() + ["--collect-only"], cwd=REPO, capture_output=True, text=True,
                             timeout=120).stdout
        collected = next((line for line in reversed(out.splitlines()) if "collected" in line or "test" in line), "?")
    except (OSError, subprocess.SubprocessError):
        collected = "?"
    print(f"1. tests: {' '.join(pytest_command(Path(requested) / 'tests.xml'))}")
    print(f"   {collected.strip()}; skipped after {TEST_BUDGET_S} s, stopped {TEST_KILL_S} s later; "
          f"estimated {plan['tests_s'] / 60:.1f} min")
    g = plan["grid"]
    print(f"2. sweep, profile {PROFILE}: systems {', '.join(SYSTEMS)}; bs {g['batch_sizes']}, h {g['hiddens']}")
    for name, e in plan["experiments"].items():
        print(f"   {name}.csv: {e['cells']} cells, ~{e['s'] / 60:.1f} min")
        for pid, p in e["panels"].items():
            print(f"     panel {pid:<10} {p['cells']:>3} cells  ~{p['s'] / 60:4.1f} min")
    print(f"   kernel compilation once: ~{plan['compile_s'] / 60:.1f} min (the first Cavs cell: {GPU_WARM_COMPILE_S:.0f} s "
          f"after the tests, {GPU_FIRST_COMPILE_S:.0f} s without; each further model or variant {GPU_VARIANT_COMPILE_S:.0f} s)")
    print(f"3. figures (Makefile): python3 -m plots fig8 / ablation --results {requested}: ~{plan['plots_s'] / 60:.1f} min")
    print(f"estimated {plan['total_s'] / 60:.1f} min in all (at most {PLAN_S / 60:.0f}; the device budget is "
          f"{DEVICE_BUDGET_S / 60:.0f} min: cells past it are not started). GPU timings in the estimate are guesses "
          f"(experiments/profiles.py, GPU_*).")
    print(f"outputs in {requested}/: tests.xml, tests.log, fig8.csv, ablation.csv, environment.json, "
          f"cell_walltimes.csv, gpu_check.json, gpu_check.md, figures/fig8.png, figures/ablation.png")


# ---------------------------------------------------------------- main

def _ints(text: str) -> tuple:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _grid(text: str) -> tuple:
    bs, _, h = text.partition(":")
    if not bs or not h:
        raise argparse.ArgumentTypeError("a grid is BS,BS,...:H,H,...")
    return _ints(bs), _ints(h)


def _pair(text: str) -> tuple:
    values = _ints(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError("bs,h")
    return values


def main(argv=None) -> int:
    global ABLATION_AT, SYSTEMS
    parser = argparse.ArgumentParser(prog="python3 -m experiments.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results/gpu", help="where the results go (default results/gpu)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its estimate; run nothing")
    parser.add_argument("--where", action="store_true", help="print the directory a run measures into")
    parser.add_argument("--skip-tests", action="store_true", help="the sweep only")
    parser.add_argument("--skip-sweep", action="store_true", help="the tests only")
    parser.add_argument("--grid", type=_grid, help="the sweep's grid instead of the largest that fits, as "
                                                  "BS,BS,...:H,H,... (e.g. 1,16,256:64,1024)")
    parser.add_argument("--ablation-at", type=_pair, help="the ablation's bs,h (default 64,512)")
    parser.add_argument("--systems", type=lambda t: tuple(x for x in t.split(",") if x),
                        help=f"a subset of {','.join(SYSTEMS)}")
    parser.add_argument("--budget-min", type=arguments.positive, default=DEVICE_BUDGET_S / 60,
                        help=f"device minutes for the whole command (default {DEVICE_BUDGET_S / 60:.0f})")
    args = parser.parse_args(argv)
    ABLATION_AT = args.ablation_at
    if args.systems:
        unknown = set(args.systems) - set(SYSTEMS)
        if unknown:
            parser.error(f"unknown systems {sorted(unknown)}; choose among {', '.join(SYSTEMS)}")
        SYSTEMS = args.systems
    start = time.monotonic()
    if args.where:
        print(results_dir(args.results))
        return 0
    here = found_modules()             # before the stand-ins
    shims = install_shims()
    plan = estimate(args.grid, not args.skip_tests) if args.grid else choose(tests=not args.skip_tests)
    if args.dry_run:
        print_plan(plan, args.results, here)
        return 0
    out = results_dir(args.results)
    out.mkdir(parents=True, exist_ok=True)
    record = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": sys.version.split()[0],
              "modules": here, "shims": shims, "machine": machine.label(machine.kind()),
              "gpu": gpu_facts(), "plan": plan, "results": str(out)}
    print(f"gpu-check into {out}: {record['machine']}; GPU {record['gpu']}", flush=True)
    if shims:
        print(f"stand-ins for missing helpers: {', '.join(shims)}", flush=True)
    print(f"plan: bs {plan['grid']['batch_sizes']}, h {plan['grid']['hiddens']}, estimated "
          f"{plan['total_s'] / 60:.1f} min", flush=True)
    deadline = start + args.budget_min * 60 - PLOT_RESERVE_S
    ok = True
    if not args.skip_tests:
        budget = min(TEST_BUDGET_S, max(30.0, deadline - time.monotonic() - plan["sweep_s"]))
        record["tests"] = run_tests(out, budget)
        t = record["tests"]
        print(f"tests: {t.get('passed', '?')} passed, {t.get('failed', '?')} failed, {t.get('errors', '?')} errors, "
              f"{t.get('skipped', '?')} skipped; {t['status']} ({t['wall_s']} s)", flush=True)
        ok &= t["status"] == "ok" and t.get("tests", 0) > 0 and not (t.get("failed") or t.get("errors"))
        write_report(out, {**record, "wall_s": time.monotonic() - start})
    if not args.skip_sweep:
        grid = (tuple(plan["grid"]["batch_sizes"]), tuple(plan["grid"]["hiddens"]))
        record["sweep"] = run_sweep(out, grid, deadline)
        for r in record["sweep"].values():
            counts = r.get("counts", {})
            ok &= r["status"] == "ok" and set(counts) <= {"ok", "already measured"}
    record["wall_s"] = round(time.monotonic() - start, 1)
    write_report(out, record)
    print(f"gpu-check: {'all passed' if ok else 'NOT all passed'} in {record['wall_s'] / 60:.1f} min; "
          f"{out}/gpu_check.md", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
