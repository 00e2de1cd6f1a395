"""Start-up cost of a new process: the first training step against a steady-state one.

    python -m experiments.studies startup [--hidden 512] [--repeats 3] [--results DIR] [--profile]

Tree-LSTM, SST's first training trees in file order, bs = 64, float32, one thread (as the bench
study). Each measurement is a fresh process (a cell, launch.run), which times: `import cavs`,
building the model and the batches, constructing the engine, the first `step` (batch 0), and
then steps over batches 0-3 twice; the steady-state step is the median of the second round.
Wall time, and the main thread's CPU time (steadier on a loaded machine: the compiles, the
kernel loads and the one-thread BLAS all run on that thread; page faults count as its time).

Cases, in this order, each in its own process:
  cold          an empty kernel cache: every generated kernel is compiled in the first step
  warm          the cache the cold run filled: kernels are loaded, not compiled
  warm+warm_up  as warm, and the engine's kernels loaded at construction (fusion.warm_up with
                F's and dF's fused groups, loss.warm_up): Numba's one-time start-up and the
                kernel loads move from the first step to the construction
The warm cases repeat `--repeats` times, interleaved. `--profile` prints, per case, the first
step's most expensive calls (cProfile, cumulative). Prints one table; writes DIR/startup.csv.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from .. import arguments, launch

START = time.perf_counter()


def engine_groups(engine) -> list:
    from cavs import fusion
    phases = [getattr(engine, "forward_phases", {}), getattr(engine, "backward_phases", {})]
    return [it for ph in phases for items in ph.values() for it in items if isinstance(it, fusion.FusedGroup)]


def add_arguments(ap) -> None:
    ap.add_argument("--hidden", type=arguments.count, default=512)
    ap.add_argument("--repeats", type=arguments.count, default=3, help="processes per warm case")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--cache", help="kernel cache directory to use (default: a new empty one); the cold case "
                                    "runs only when it is empty")


def cell(spec: dict) -> dict:
    t0 = time.perf_counter()
    import cavs
    from cavs import fusion, loss
    t_import = time.perf_counter() - t0

    t0 = time.perf_counter()
    model = cavs.models.build("tree_lstm", hidden=spec["hidden"])
    samples = cavs.datasets.load_samples("tree_lstm", "train", limit=4 * 64)
    batches = [model.make_batch(samples[i:i + 64]) for i in range(0, len(samples), 64)]
    t_data = time.perf_counter() - t0

    t0, c0 = time.perf_counter(), time.thread_time()
    engine = cavs.Engine(model, threads=1)
    if spec["warm_up"]:
        fusion.warm_up(engine_groups(engine), engine.dtype.name)
        loss.warm_up(engine.dtype.name)
    t_construct, c_construct = time.perf_counter() - t0, time.thread_time() - c0

    profile = None
    if spec["profile"]:
        import cProfile
        profile = cProfile.Profile()
        profile.enable()
    t0, c0 = time.perf_counter(), time.thread_time()
    engine.step(batches[0])
    t_first, c_first = time.perf_counter() - t0, time.thread_time() - c0
    if profile is not None:
        profile.disable()
    compiled = fusion.compile_stats()

    steps, cpu = [], []
    for _ in range(2):
        for b in batches:
            t0, c0 = time.perf_counter(), time.thread_time()
            engine.step(b)
            steps.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
    steady = statistics.median(steps[len(batches):])
    steady_cpu = statistics.median(cpu[len(batches):])
    out = {"import_s": t_import, "data_s": t_data, "construct_s": t_construct, "construct_cpu_s": c_construct, "first_step_s": t_first,
           "steady_step_s": steady, "first_over_steady": t_first / steady,
           "first_step_cpu_s": c_first, "steady_step_cpu_s": steady_cpu, "first_over_steady_cpu": c_first / steady_cpu,
           "process_to_first_step_end_s": time.perf_counter() - START - sum(steps),
           "kernels_compiled": compiled["compiled"], "kernels_loaded": compiled["loaded"], "status": "ok"}
    if profile is not None:
        import io
        import pstats
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
        out["profile"] = text.getvalue()
    return out


def run_cell(spec: dict, cache: str) -> dict:
    """One measurement in a fresh process whose kernel cache is `cache`."""
    result = launch.run("experiments.studies", ["startup", "--cell", json.dumps(spec)], time_limit_s=1800,
                        environ={**os.environ, "CAVS_KERNEL_CACHE": cache})
    if result["status"] != "ok":
        raise RuntimeError(f"the measuring process {result['status']}")
    return result


def main(results_dir: Path, args) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="cavs-kernels-") as fresh:
        cache = args.cache or fresh
        Path(cache).mkdir(parents=True, exist_ok=True)
        cold = [] if any(Path(cache).glob("k_*.py")) else [("cold", False)]
        cases = cold + [("warm", False), ("warm+warm_up", True)] * args.repeats
        for case, warm_up in cases:
            r = run_cell({"hidden": args.hidden, "warm_up": warm_up, "profile": args.profile}, cache)
            profile = r.pop("profile", None)
            del r["status"]
            rows.append({"case": case, "hidden": args.hidden, **r})
            print(f"{case:13s} import {r['import_s']:.2f} s, construct {r['construct_s']:.2f} s, first step "
                  f"{r['first_step_s']:.3f} s, steady {r['steady_step_s']:.3f} s: {r['first_over_steady']:.1f}x "
                  f"(compiled {r['kernels_compiled']}, loaded {r['kernels_loaded']}); CPU time of the main thread: construct "
                  f"{r['construct_cpu_s']:.2f} s, first {r['first_step_cpu_s']:.3f} s, steady {r['steady_step_cpu_s']:.3f} s: "
                  f"{r['first_over_steady_cpu']:.1f}x", flush=True)
            if profile:
                print(profile)
    import pandas as pd
    launch.write_rows(results_dir / "startup.csv", rows)
    df = pd.DataFrame(rows)
    summary = df.groupby("case", sort=False)[["import_s", "construct_s", "first_step_s", "steady_step_s",
                                              "first_over_steady", "first_over_steady_cpu", "kernels_compiled"]].median()
    print("\nmedian per case (Tree-LSTM h = %d, bs = 64, one thread):" % args.hidden)
    print(summary.to_string(float_format=lambda v: f"{v:.3f}"))
    return 0
