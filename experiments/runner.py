"""Sweep runner: expands an experiment into cells, runs each in a fresh subprocess under a time limit,
appends one CSV row per cell, and skips the cells a previous run already recorded.

Where the cell subprocesses run is the executor's business (experiments/executors.py: here, or as Ray
tasks on a cluster); this driver alone writes the CSV, one row as each result arrives.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from . import environment, executors, launch, machine, registry, results
from .profiles import Profile, estimated_cell_s, measured_samples
from .registry import SYSTEM_FACTS, Experiment

# the fields that identify a cell: equal keys = the same measurement (so the profile is part of it)
KEY_FIELDS = ("experiment", "panel", "workload", "system", "variant", "mode", "batch_size", "hidden",
              "leaves", "threads", "device", "profile")
EPOCH_SAMPLES = {"fixed_lstm": 14_524, "var_lstm": 42_068, "tree_fc": 8_192, "tree_lstm": 8_544}  # estimates only


@dataclass
class Plan:
    cells: list[dict]
    skipped: dict[str, str] = field(default_factory=dict)      # system -> why it does not run here


def resolve_device(profile: Profile) -> str:
    if profile.device == "auto":
        return "cuda" if machine.gpu_present() else "cpu"
    return profile.device


def cell_id(cell: dict) -> str:
    key = {k: cell[k] for k in KEY_FIELDS}
    if cell.get("ftz") is False:      # FTZ/DAZ off is another measurement (ids with it on are unchanged)
        key["ftz"] = False
    key = json.dumps(key, sort_keys=True)
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def unavailable(system: str, device: str) -> str | None:
    """Why `system` cannot run on this machine and device, or None."""
    if ":" in system:          # a System class by import path (tests): its cell reports an import error
        return None
    framework, gpu_capable, _ = SYSTEM_FACTS[system]
    if device == "cuda" and not gpu_capable:
        return "cannot run on a GPU"
    if framework and importlib.util.find_spec(framework) is None:
        return f"{framework} is not installed"
    from baselines import _REGISTRY          # the system's module name, without importing its framework
    module = _REGISTRY[system][0]
    return None if importlib.util.find_spec(module) else f"{module} is not written yet"


def plan(experiment: Experiment, profile: Profile, *, systems=None, panels=None, threads: int = 1,
         check_available: bool = True, device: str | None = None) -> Plan:
    device = device or resolve_device(profile)
    out = Plan([])
    for panel in experiment.panels:
        if panels and panel.id not in panels:
            continue
        for system in panel.systems:
            if systems and system not in systems:
                continue
            values = panel.values_for(system) if ":" not in system else panel.values
            if profile.reduced_grid and len(values) > 2:
                values = (values[0], values[len(values) // 2])
            why = check_available and (out.skipped.get(system) or unavailable(system, device))
            if why:
                out.skipped[system] = why
                continue
            for mode in panel.modes:
                for variant, options in panel.variants:
                    for value in values:
                        cell = {"experiment": experiment.name, "panel": panel.id, "workload": panel.workload,
                                "system": system, "variant": variant, "options": options, "mode": mode,
                                "batch_size": panel.batch_size, "hidden": panel.hidden,
                                "leaves": panel.leaves, "threads": threads, "device": device,
                                "profile": profile.name, panel.vary: value}
                        cell["ftz"] = environment.ftz_requested()
                        cell["samples"] = measured_samples(profile, cell)
                        cell["warmup_batches"], cell["repeats"] = profile.warmup_batches, profile.repeats
                        cell["min_timed_s"] = profile.min_timed_s
                        cell["cell_id"] = cell_id(cell)
                        out.cells.append(cell)
    return out


def estimate_s(cells: list[dict], profile: Profile) -> float:
    return sum(estimated_cell_s(profile, c, EPOCH_SAMPLES[c["workload"]]) for c in cells)


def _check_same_machine(results_dir: Path, kind: dict | None = None, where: str = "this one") -> None:
    """Resuming skips measured cells, so it must never mix machines in one CSV: results/ holds the
    reference machine's numbers, and another kind of machine is told to measure into its own dir."""
    machine.check_results_dir(results_dir, kind or machine.kind(), where)


def _write_environment(results_dir: Path, executor, threads: int, profile: str, kind: dict) -> None:
    """environment.json, collected where the cells run, with the machine kind the directory holds."""
    if isinstance(executor, executors.LocalExecutor):
        path = environment.write(results_dir, threads, profile)
        env = json.loads(path.read_text())
    else:
        path, env = results_dir / "environment.json", executor.environment(threads, profile)
    env["machine_kind"] = kind
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(env, indent=2) + "\n")
    os.replace(tmp, path)


def _prepare(cells: list[dict], log_dir: Path, progress: bool = True) -> None:
    """Builds each model of `cells` whose system measures the machine at its first use
    (registry.MEASURED_ONCE) once, in one process per thread count, before the cells: the measurement
    is cached, and a cell would otherwise pay it inside its time limit (Var-LSTM h = 1024: 145 s on
    the Zen 3 VM, against the cpu profile's 90 s). Where it fails, the cells measure as before. A Ray
    sweep builds on each node instead (executors.RayExecutor)."""
    by_threads: dict[int, list[dict]] = {}
    for c in cells:
        if c["system"] in registry.MEASURED_ONCE:
            by_threads.setdefault(c["threads"], []).append(c)
    for threads, mine in sorted(by_threads.items()):
        t0 = time.monotonic()
        if progress:
            print(f"building {len({launch.model_key(c) for c in mine})} model(s) once before the cells, at {threads} "
                  "thread(s): the engine measures its GEMM libraries on a model's first use on a machine", file=sys.stderr)
        result = launch.prepare_models(mine, threads, log_dir / f"prepare-{threads}.log")
        if result["status"] != "ok":
            print(f"building the models failed ({result['status']}); each cell measures on its own",
                  file=sys.stderr)
        elif progress:
            print(f"built in {time.monotonic() - t0:.0f} s", file=sys.stderr)


def run(experiment: Experiment, profile: Profile, results_dir, *, systems=None, panels=None, threads: int = 1,
        time_limit_s: float | None = None, budget_s: float | None = None, retry_failed: bool = False,
        progress: bool = True, executor=None) -> dict:
    """Runs every cell not yet in RESULTS/<experiment>.csv, cheapest first (the cost model's guess), and
    starts no cell that would end past `budget_s` (default: the profile's); returns counts by status.
    `executor`: executors.LocalExecutor() (the default) or an entered executors.RayExecutor."""
    executor = executor or executors.LocalExecutor()
    results_dir = Path(results_dir)
    with results.exclusive(results_dir, f"the {experiment.name} sweep ({profile.name} profile)"):
        return _run(experiment, profile, results_dir, systems=systems, panels=panels, threads=threads,
                    time_limit_s=time_limit_s, budget_s=budget_s, retry_failed=retry_failed, progress=progress,
                    executor=executor)


def _run(experiment, profile, results_dir, *, systems, panels, threads, time_limit_s, budget_s, retry_failed,
         progress, executor) -> dict:
    path = results.csv_path(results_dir, experiment.name)
    device = "cuda" if profile.device == "cuda" or (profile.device == "auto" and executor.gpu_present()) else "cpu"
    the_plan = plan(experiment, profile, systems=systems, panels=panels, threads=threads, device=device)
    for system, why in the_plan.skipped.items():
        print(f"skipped {system}: {why}", file=sys.stderr)
    git_rev = environment.git_revision()
    kind = executor.check(threads, device, git_rev)
    _check_same_machine(results_dir, kind, "this one" if executor.name == "local" else "the cluster's nodes")
    if retry_failed:
        results.drop_failed(path)
    done = results.done_ids(path)
    todo = sorted((c for c in the_plan.cells if c["cell_id"] not in done), key=lambda c: estimate_s([c], profile))
    limit = time_limit_s or profile.time_limit_s
    budget = profile.sweep_budget_s if budget_s is None else budget_s
    if todo:     # a sweep with nothing left to measure (a redraw) leaves environment.json alone
        _write_environment(results_dir, executor, threads, profile.name, kind)
    if isinstance(executor, executors.LocalExecutor) and device == "cpu":
        _prepare(todo, results_dir / "logs", progress)
    ours = machine.label(kind)
    counts = {"already measured": len(the_plan.cells) - len(todo)}
    bar = tqdm(total=len(the_plan.cells), initial=counts["already measured"], unit="cell", desc=experiment.name,
               disable=not progress, dynamic_ncols=True)
    start = time.monotonic()
    started = 0

    def may_start(cell):
        nonlocal started
        if budget and time.monotonic() - start + min(limit, estimate_s([cell], profile)) > budget:
            return False
        started += 1
        if executor.name == "local":
            bar.set_postfix_str(f"{cell['panel']} {cell['system']} {cell['variant']} {cell['mode']} "
                                f"bs={cell['batch_size']} h={cell['hidden']} L={cell['leaves']}")
        return True

    for cell, result in executor.run(todo, limit, results_dir / "logs", may_start):
        if result.get("machine") and result["machine"] != ours:      # a node joined mid-sweep
            result = {"status": f"failed: ran on {result.get('node')}, a machine of another kind "
                                f"({result['machine']}; this sweep's: {ours})", "node": result.get("node"),
                      "machine": result["machine"]}
        row = {**{k: v for k, v in cell.items() if k in results.COLUMNS}, **result,
               "options": json.dumps(cell["options"], sort_keys=True), "git_rev": git_rev,
               "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if result["status"] != "ok":
            row["samples"] = cell["samples"]
        results.append_row(path, row)
        status = "ok" if row["status"] == "ok" else row["status"].split(":")[0]
        counts[status] = counts.get(status, 0) + 1
        bar.update()
    bar.close()
    if started < len(todo):
        counts["left for a rerun (sweep budget reached)"] = len(todo) - started
    return counts
