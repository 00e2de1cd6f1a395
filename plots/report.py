"""`python -m plots.report --results DIR`: DIR/REPORT.md, the results report of one machine kind's directory.

    python -m plots.report --results results/amd-epyc-2cpu-24gib
    python -m plots.report --all                  # every kind directory under results/
    python -m plots.report --results DIR --update-readme [README.md]   # also the README's claims block

One section per figure, table and study the directory holds: what it shows, its figure where
DIR/figures/<name>.png exists, the table itself (key columns only), and the commit(s) each file was
measured at (the distinct values of its `git_rev` column, with row counts). Then the paper's claims
(plots/claims.py), the CI baseline, any other files, and DIR/notes.md verbatim under "Notes". It reads
the directory's files only (nothing from experiments/), and writes no date: regenerating from the same
files gives the same report.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from .claims import claims, measured_on
from .load import load, read_csv

ROOT = Path("results")
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
SWEEP_STATUS_OK = "ok"

WORKLOADS = {"fixed_lstm": "Fixed-LSTM", "var_lstm": "Var-LSTM", "tree_fc": "Tree-FC", "tree_lstm": "Tree-LSTM"}
SYSTEM_ORDER = ("cavs", "cavs-serial", "cudnn", "tensorflow", "dynet", "dynet-depth", "fold", "fold-n",
                "pytorch-levels", "pytorch")
VARIANT_ORDER = ("all-off", "lazy", "eager", "fusion", "streaming", "share_tokens", "all-on")
HEADERS = {"batch_size": "bs", "hidden": "h", "leaves": "L", "workload": "workload", "panel": "panel",
           "mode": "mode", "system": "system"}


# ---------------------------------------------------------------- number formatting

def _num(x) -> str:
    """A number as a reader wants it in a table: 4 significant digits, thousands without exponent."""
    if x is None or (isinstance(x, float) and pd.isna(x)):
        return ""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int,)) or (isinstance(x, float) and x.is_integer() and abs(x) >= 1):
        return f"{int(x):,}"
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
    return str(x)


def _seconds(x, extrapolated=False) -> str:
    if pd.isna(x):
        return "n/a"
    text = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return text + ("*" if extrapolated else "")


def _pct(x) -> str:
    return "" if pd.isna(x) else f"{100 * x:.1f}"


def _signed_pct(x) -> str:
    return "" if pd.isna(x) else f"{100 * x:+.1f}%"


def _times(x) -> str:
    return "" if pd.isna(x) else f"{x:.2f}x"


def markdown(df: pd.DataFrame) -> str:
    """A DataFrame of strings (or numbers) as a markdown table (pandas' to_markdown needs tabulate)."""
    cells = df.map(lambda v: v if isinstance(v, str) else _num(v))
    header = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in cells.itertuples(index=False)]
    return "\n".join([header, rule, *body])


# ---------------------------------------------------------------- what each figure, table and study shows

Cell = Callable[[pd.Series], str]


def _epoch(r):
    return _seconds(r.epoch_s, r.extrapolated)


def _construct(r):
    share = r.construct_s / r.total_s if r.total_s else float("nan")
    return f"{_seconds(r.construct_s, r.extrapolated)} ({share:.0%})"


@dataclass(frozen=True)
class Sweep:
    """A sweep experiment's CSV (experiments/results.py columns): one row per cell."""
    name: str
    title: str
    what: str
    rows: tuple[str, ...]                   # the table's row keys (constant ones are dropped)
    cells: dict[str, Cell]                  # per column label, the text of one cell
    columns: str = "system"                 # one table column per value of this CSV column
    unit: str = "Seconds per epoch."


@dataclass(frozen=True)
class Study:
    """A one-off measurement's CSV: the table is its key columns, renamed."""
    name: str
    title: str
    what: str
    columns: dict[str, str]                 # CSV column -> header (only those present are shown)
    formats: dict[str, Callable] = field(default_factory=dict)
    figure: str | None = None               # figures/<figure>.png, when not <name>.png
    file: str | None = None                 # when not <name>.csv


SWEEPS = (
    Sweep("fig8", "Figure 8: time per epoch against batch size and hidden size",
          "Training time per epoch of every system on the four workloads: panels a-d vary the batch size "
          "at h = 512, panels e-h the hidden size at bs = 64 (the paper's Figure 8). Lower is better.",
          ("panel", "workload", "batch_size", "hidden"), {"epoch": _epoch}),
    Sweep("fig9", "Figure 9: graph construction",
          "Graph construction time per epoch and its share of the epoch: (a) Tree-FC at bs = 64, h = 512 "
          "over the tree size L; (b) Tree-LSTM at h = 512 over the batch size (the paper's Figure 9). "
          "Each cell: construction seconds (share of the epoch).",
          ("panel", "workload", "leaves", "batch_size"), {"construction": _construct}),
    Sweep("table1", "Table 1: computation time",
          "Computation time per epoch (graph construction excluded) on Tree-FC and Tree-LSTM at h = 512 "
          "(the paper's Table 1).",
          ("workload", "batch_size"), {"compute": lambda r: _seconds(r.compute_s, r.extrapolated)}),
    Sweep("table2", "Table 2: memory movement against computation",
          "Tree-LSTM at h = 512, training and inference: the time per epoch spent moving memory (gather, "
          "gradient scatter, pull, push) beside the rest of the computation, Cavs against DyNet (the "
          "paper's Table 2). DyNet's memory time is sampled with perf, not timed; n/a where perf could "
          "not sample.",
          ("mode", "batch_size"),
          {"memory": lambda r: _seconds(r.memory_s, r.extrapolated),
           "computation": lambda r: _seconds(r.computation_s, r.extrapolated)}),
    Sweep("ablation", "Ablation: the engine's optimizations",
          "Cavs at bs = 64, h = 512 with lazy batching, eager batching, fusion and streaming switched on "
          "one at a time and all together, against all off. Each cell: seconds per epoch (speedup over "
          "all off).",
          ("workload",), {"epoch": _epoch}, columns="variant"),
)

STUDIES = (
    Study("bench", "The engine against DyNet, PyTorch by level, TensorFlow and the GEMM floor",
          "Cavs (and its switch variants), DyNet, PyTorch batched by level (Tree-LSTM) and TensorFlow "
          "(Var-LSTM) on the first SST training trees and PTB sentences, each system in its own process, "
          "interleaved rounds, the fastest kept, at each thread count of the run. The floor is the "
          "products the workload needs, each at the fastest installed library's time on its shape at "
          "that thread count; the frontier bound times the loop's own product shapes the same way.",
          {"workload": "workload", "hidden": "h", "system": "system", "threads": "threads",
           "total_s": "time (s)", "cavs_speedup": "system / Cavs", "floor_s": "floor (s)",
           "frontier_bound_s": "frontier bound (s)", "over_floor": "/ floor",
           "over_frontier_bound": "/ bound", "thread_speedup": "over own 1 thread",
           "best_gemm_gflops": "best GEMM GFLOP/s"},
          {"cavs_speedup": _times, "over_floor": _times, "over_frontier_bound": _times,
           "thread_speedup": _times}),
    Study("nary", "Variable arity: a child-sum Tree-LSTM on n-ary trees",
          "The child-sum Tree-LSTM (h = 256, embedding 128, bs = 64) on SST trees merged into n-ary "
          "trees, Cavs against DyNet with autobatching, each beside the floor of the products the model "
          "needs. `form` says how the Cavs model reads its children: as edges (`children()`, "
          "cavs/models/child_sum.py) or through declared child slots (`child slots`; a file without the "
          "`form` column measured the slot form only). `cavs-prebuilt` builds its batches before the "
          "clock; the synthetic sets have the same number of edges at maximum degree 4, 32 and 256 "
          "(time per edge, first step with compilation).",
          {"cell": "cell", "form": "form", "arity": "child slots", "trees": "trees",
           "max_degree": "max degree", "edges": "edges",
           "best_s": "time (s)", "construct_s": "construction (s)", "per_edge_us": "µs / edge",
           "first_step_s": "first step (s)", "floor_s": "floor (s)", "over_floor": "/ floor",
           "over_frontier_bound": "/ bound", "last_loss": "loss"},
          {"over_floor": _times, "over_frontier_bound": _times}),
    Study("task_cost", "Where a Tree-LSTM epoch goes, per loop task",
          "One Tree-LSTM epoch (512 SST trees, bs = 64, one thread) split into graph construction, the "
          "products and the rest of the compute, with the loop tasks and kernel launches counted; "
          "`prebuilt` is the epoch with its batches built beforehand.",
          {"hidden": "h", "epoch_s": "epoch (s)", "prebuilt_epoch_s": "prebuilt (s)",
           "construct_s": "construction (s)", "gemm_s": "products (s)", "forward_gflops": "forward GFLOP/s",
           "other_compute_s": "rest (s)", "loop_tasks": "loop tasks", "launches": "launches",
           "launches_per_task": "launches / task", "other_us_per_task": "rest per task (µs)",
           "other_us_per_launch": "rest per launch (µs)"}),
    Study("policies", "Batching policies",
          "Tree-LSTM and Tree-FC at h = 512, bs = 64 under each batching policy of the scheduler: tasks per "
          "batch, rows per task, and the time against `batched` (the default). Every policy computes the "
          "same numbers.",
          {"workload": "workload", "policy": "policy", "tasks_per_batch": "tasks / batch",
           "rows_per_task_median": "rows / task (median)", "loop_rows_per_task_median": "loop rows / task (median)",
           "loop_tasks_under_min_rows": "loop tasks < 32 rows", "time_s": "time (s)",
           "time_over_batched": "/ batched"},
          {"loop_tasks_under_min_rows": lambda x: "" if pd.isna(x) else f"{x:.0%}", "time_over_batched": _times}),
    Study("startup", "Start-up: a new process's first step",
          "A new process's first training step against a steady one (Tree-LSTM h = 512, bs = 64, one "
          "thread), with an empty kernel cache (cold) and one filled by an earlier process (warm).",
          {"case": "case", "import_s": "import (s)", "construct_s": "construction (s)",
           "first_step_s": "first step (s)", "steady_step_s": "steady step (s)",
           "first_over_steady": "first / steady", "kernels_compiled": "kernels compiled",
           "kernels_loaded": "kernels loaded"},
          {"first_over_steady": _times}),
    Study("extrapolation", "The extrapolation check",
          "The `cpu` profile times a slice of about 0.75 s per cell twice, keeps the faster pass (one "
          "pass of about 1 s before commit bac6a4b), and extrapolates the epoch. For a "
          "set of cells covering every kind of system, each workload, h and bs, this compares that "
          "extrapolation with a long measurement (the whole epoch, or 20x the slice); the check fails "
          "past 15%.",
          {"system": "system", "workload": "workload", "batch_size": "bs", "hidden": "h",
           "slice_samples": "slice (samples)", "long_samples": "long run (samples)",
           "long_is_epoch": "whole epoch", "extrapolated_epoch_s": "extrapolated epoch (s)",
           "measured_epoch_s": "measured epoch (s)", "rel_error": "error"},
          {"rel_error": _signed_pct}),
    Study("neighbours", "Figure 8 cells that break their curves, reproduced",
          "Cells of Figure 8 whose time per epoch breaks its curve, and their neighbours, each measured "
          "again over a run 10x longer than its slice (the extrapolation check's method).",
          {"system": "system", "workload": "workload", "batch_size": "bs", "hidden": "h",
           "slice_samples": "slice (samples)", "long_samples": "long run (samples)",
           "extrapolated_epoch_s": "extrapolated epoch (s)", "measured_epoch_s": "measured epoch (s)",
           "rel_error": "error"},
          {"rel_error": _signed_pct}),
    Study("sst", "SST sentiment, trained to accuracy",
          "The binary Tree-LSTM trained on the Stanford Sentiment Treebank (h = 150, embedding 300, "
          "Adagrad) on Cavs, DyNet and PyTorch per sample: per epoch the training time, the loss and the "
          "root accuracy (%) on dev, and on test at the best dev epoch.",
          {"system": "system", "epoch": "epoch", "trees": "trees", "train_s": "train (s)",
           "cum_train_s": "cum. train (s)", "train_loss": "train loss", "dev_fine": "dev fine",
           "dev_binary": "dev binary", "test_fine": "test fine", "test_binary": "test binary"},
          {"dev_fine": _pct, "dev_binary": _pct, "test_fine": _pct, "test_binary": _pct}),
    Study("torch_module", "The engine inside PyTorch: cavs.torch against engine.step",
          "The Tree-LSTM (embedding 300, 5 classes) on the first 512 SST training trees, bs = 64, one "
          "thread: `engine.step` with the built-in head and SGD against the same step through "
          "cavs.torch.VertexModule with a torch head, F.cross_entropy, loss.backward() and torch.optim.SGD, "
          "from the same weights (the same losses), interleaved rounds, the fastest kept.",
          {"cell": "cell", "hidden": "h", "best_s": "time (s)", "step_ms": "ms / step",
           "module_over_engine": "module / engine", "first_loss": "first loss", "last_loss": "last loss"},
          {"module_over_engine": _times}),
    Study("targets", "The speed targets against the floor",
          "The engine-speed targets the project set itself, each turned into the Cavs time it asks for "
          "and set beside the floor and frontier bound of the same run (derived from bench.csv and "
          "nary.csv; no measurement of its own). A target that asks for less than the floor cannot be "
          "met on this machine by any implementation.",
          {}, file="targets.md"),
)
KNOWN_FILES = {"environment.json", "notes.md", "REPORT.md", "README.md"} | {f"{s.name}.csv" for s in SWEEPS} \
    | {s.file or f"{s.name}.csv" for s in STUDIES}


# ---------------------------------------------------------------- reading the directory

def commits(df: pd.DataFrame, column: str = "git_rev") -> str:
    """'83c3cb2 (247 rows)', or 'not recorded in the file'."""
    if column not in df or df[column].isna().all():
        return "not recorded in the file"
    counts = df[column].fillna("not recorded").astype(str).str.strip().value_counts()
    return ", ".join(f"`{rev}` ({_rows(n)})" for rev, n in counts.items())


def _rows(n: int) -> str:
    return f"{n} row{'s' if n != 1 else ''}"


def _ordered(values, order) -> list:
    known = [v for v in order if v in set(values)]
    return known + sorted(v for v in set(values) if v not in order)


def machine_label(kind: dict) -> str:
    """A kind as one line, as experiments/machine.py's label writes it (reimplemented: plots read results only)."""
    gen = None
    if any(kind.get(k) for k in ("cpu_vendor", "cpu_family", "cpu_model_number", "cpu_isa")):
        gen = (f"{kind.get('cpu_vendor') or '?'} family {kind.get('cpu_family') or '?'} model "
               f"{kind.get('cpu_model_number') or '?'}, {kind.get('cpu_isa') or '?'}")
    mem = f"{kind['memory_gib']} GiB" if kind.get("memory_gib") is not None else "memory not recorded"
    cpu = f"{kind.get('cpu_model')} ({gen})" if gen else f"{kind.get('cpu_model')} (CPU generation not recorded)"
    return f"{cpu}, {kind.get('cpu_count')} CPUs, {mem}, {kind.get('gpu') or 'no GPU'}"


def machine(results: Path) -> tuple[str, list[str]]:
    """(the machine kind, further lines about the environment) from environment.json, else ci/baseline.json."""
    env_path = results / "environment.json"
    if env_path.exists():
        env = json.loads(env_path.read_text())
        kind = env.get("machine_kind") if isinstance(env.get("machine_kind"), dict) else {
            "cpu_model": env.get("cpu_model"), "cpu_count": env.get("cpu_count"), "gpu": env.get("gpu")}
        lines = []
        libs = {k: v for k, v in (env.get("libraries") or {}).items() if v}
        if libs:
            lines.append("Libraries: " + ", ".join(f"{k} {v}" for k, v in libs.items())
                         + (f"; Python {env['python']}" if env.get("python") else "") + ".")
        if env.get("cavs_cpu_blas"):
            lines.append(f"The engine's CPU BLAS: {env['cavs_cpu_blas']}; threads per cell: "
                         f"{env.get('cell_threads', 'not recorded')}.")
        blas = env.get("cpu_blas")
        if isinstance(blas, dict):
            lines.append(f"GEMM libraries: {', '.join(blas.get('libraries') or [])}; OpenBLAS runs its "
                         f"{blas.get('openblas_kernels_in_cells')} kernels in the cells ({', '.join(blas.get('unset_in_cells') or [])} "
                         f"unset there for every system); the engine: {blas.get('engine')}; threads per cell: "
                         f"{env.get('cell_threads', 'not recorded')}.")
        numeric = env.get("numeric")
        if isinstance(numeric, dict):
            lines.append(f"Numeric environment: flush-to-zero {'on' if numeric.get('ftz') else 'off'}, "
                         f"denormals-are-zero {'on' if numeric.get('daz') else 'off'}, for every system.")
        elif numeric is None:
            lines.append("Numeric environment: not recorded (these rows predate the harness's FTZ/DAZ setting).")
        if env.get("git_rev"):
            lines.append(f"environment.json was written by the sweep at `{env['git_rev']}`"
                         + (f" ({env['profile']} profile)." if env.get("profile") else "."))
        return machine_label(kind), lines
    baseline = results / "ci" / "baseline.json"
    if baseline.exists():
        data = json.loads(baseline.read_text())
        if isinstance(data.get("kind"), dict):
            return machine_label(data["kind"]), ["No environment.json here: the kind is the CI baseline's."]
    return "not recorded (no environment.json)", []


# ---------------------------------------------------------------- sections

def _figure_lines(results: Path, name: str, title: str) -> list[str]:
    png = results / "figures" / f"{name}.png"
    return [f"![{title}](figures/{name}.png)", ""] if png.exists() else []


def sweep_table(sweep: Sweep, ok: pd.DataFrame) -> pd.DataFrame:
    ok = ok.sort_values("timestamp") if "timestamp" in ok else ok
    rows = [r for r in sweep.rows if r in ok and ok[r].nunique() > 1] or [sweep.rows[0]]
    if sweep.name == "ablation":
        base = ok[ok.variant == "all-off"].drop_duplicates("workload", keep="last").set_index("workload").epoch_s
        ok = ok.assign(speedup=ok.workload.map(base) / ok.epoch_s)
        cells = {"epoch": lambda r: f"{_epoch(r)} ({_times(r.speedup)})"}
    else:
        cells = sweep.cells
    ok = ok.drop_duplicates(rows + [sweep.columns] + (["mode"] if "mode" in ok and "mode" not in rows else []),
                            keep="last")
    order = SYSTEM_ORDER if sweep.columns == "system" else VARIANT_ORDER
    keys = ok[rows].drop_duplicates()
    sort = {"mode": lambda c: c.map({"train": 0, "infer": 1})}
    keys = keys.sort_values(rows, key=lambda c: sort[c.name](c) if c.name in sort else c)
    out = keys.copy()
    if "workload" in out:
        out["workload"] = out["workload"].map(lambda w: WORKLOADS.get(w, w))
    out.columns = [HEADERS.get(c, c) for c in rows]
    for col in _ordered(ok[sweep.columns].unique(), order):
        sub = ok[ok[sweep.columns] == col].set_index(rows)
        for label, fn in cells.items():
            header = col if len(cells) == 1 else f"{col} {label}"
            out[header] = [fn(sub.loc[k]) if k in sub.index else "-"
                           for k in (tuple(x) if len(rows) > 1 else x[0] for x in keys.to_numpy())]
    return out.reset_index(drop=True)


def sweep_section(results: Path, sweep: Sweep) -> list[str]:
    path = results / f"{sweep.name}.csv"
    raw = read_csv(path)
    lines = [f"## {sweep.title}", "", sweep.what, ""]
    lines += _figure_lines(results, sweep.name, sweep.title)
    lines += [f"Source: `{path.name}`, {_rows(len(raw))}. Measured at: {commits(raw)}.", ""]
    try:
        ok, failed, profile = load(results, sweep.name)
    except ValueError as exc:
        return lines + [f"No rows to show: {exc}.", ""]
    others = int((raw["profile"].astype(str) != str(profile)).sum()) if "profile" in raw else 0
    note = f"Profile `{profile}`" + (f" ({others} rows of other profiles not shown)" if others else "") + ". "
    note += sweep.unit
    if len(ok) and ok["extrapolated"].all():       # one note, not a `*` on every cell
        note += " Every value is extrapolated from a measured slice of the epoch."
        ok = ok.assign(extrapolated=False)
    elif ok["extrapolated"].any():
        note += " `*`: extrapolated from a measured slice of the epoch."
    note += " `-`: not measured."
    if len(failed):
        statuses = failed["status"].astype(str).str.split(":").str[0].value_counts()
        note += " Not ok: " + ", ".join(f"{n} {s}" for s, n in statuses.items()) + "."
    lines += [note, ""]
    if len(ok):
        lines += [markdown(sweep_table(sweep, ok)), ""]
    if sweep.name == "fig8" and (results / "figures" / "memory.png").exists():
        lines += ["Peak resident memory per cell process across the hidden-size panels (bs = 64)"
                  + (" ([table](figures/memory.md))" if (results / "figures" / "memory.md").exists() else "")
                  + ":", "", "![Peak memory](figures/memory.png)", ""]
    return lines


def _markdown_table(text: str) -> pd.DataFrame:
    """The first markdown table in `text` as a DataFrame of strings."""
    rows = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    cells = [c for c in cells if not all(set(x) <= set("-: ") for x in c)]
    if not cells:
        return pd.DataFrame()
    return pd.DataFrame(cells[1:], columns=cells[0])


def study_section(results: Path, study: Study) -> list[str]:
    path = results / (study.file or f"{study.name}.csv")
    lines = [f"## {study.title}", "", study.what, ""]
    lines += _figure_lines(results, study.figure or study.name, study.title)
    if path.suffix == ".md":
        df = _markdown_table(path.read_text())
        lines += [f"Source: `{path.name}`, {_rows(len(df))}. Measured at: {commits(df, 'commit')}.", ""]
        # the tracker's issue numbers mean nothing to a reader of the report
        df = df.drop(columns=[c for c in df.columns if c.lower() == "issue"])
        return lines + ([markdown(df), ""] if len(df) else [])
    df = read_csv(path)
    lines += [f"Source: `{path.name}`, {_rows(len(df))}. Measured at: {commits(df)}.", ""]
    if "status" in df and (df["status"].astype(str) != SWEEP_STATUS_OK).any():
        bad = df["status"].astype(str)[df["status"].astype(str) != SWEEP_STATUS_OK]
        lines += ["Not ok: " + ", ".join(f"{n} {s}" for s, n in bad.value_counts().items()) + ".", ""]
    cols = [c for c in study.columns if c in df]
    if cols:
        table = df[cols].copy()
        if "workload" in table:
            table["workload"] = table["workload"].map(lambda w: WORKLOADS.get(w, w))
        for col, fn in study.formats.items():
            if col in table:
                table[col] = table[col].map(fn)
        table.columns = [study.columns[c] for c in cols]
        lines += [markdown(table), ""]
    if study.name == "sst" and (results / "figures" / "sst.md").exists():
        lines += ["Time to accuracy, the thresholds and the published figures: [figures/sst.md](figures/sst.md).", ""]
    return lines


def claims_section(results: Path) -> list[str]:
    table = claims(results)
    if table.count("\n") <= 2:
        return []
    sources = [n for n in ("fig8", "fig9", "ablation") if (results / f"{n}.csv").exists()]
    where = measured_on(results)
    return ["## The paper's claims next to what was measured here", "",
            f"Ratios of per-epoch times from the same sweep (one machine; {where}); computed "
            f"by `plots/claims.py` from {', '.join(f'`{s}.csv`' for s in sources)}. "
            + ("Measured on a GPU, as the paper's figures were." if where == "GPU" else
               "The paper's figures are from a GPU; a small product on a CPU is not launch-bound, so its "
               "GPU ratios are not expected here."),
            "", table.rstrip("\n"), ""]


def ci_section(results: Path) -> list[str]:
    path = results / "ci" / "baseline.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = ["## CI baseline (`make bench-ci`)", "",
             "The commit `make bench-ci` compares HEAD's engine with on this machine kind, and Cavs's speedups "
             "over the reference systems recorded with it (checked only on a machine of this kind).", "",
             f"Source: `ci/baseline.json`. Commit: `{data.get('commit') or data.get('git_rev')}`"
             + (f", recorded {data['date']}" if data.get("date") else "") + "."
             + (f" How: {data['how']}." if data.get("how") else ""), ""]
    speedups = data.get("speedups") or {}
    if speedups:
        table = pd.DataFrame([(k.split("/")[0], k.split("/")[1], _times(v)) for k, v in sorted(speedups.items())],
                             columns=["workload", "reference system", "its time / Cavs's"])
        table["workload"] = table["workload"].map(lambda w: WORKLOADS.get(w, w))
        lines += [markdown(table), ""]
    epochs = data.get("cavs_epoch_s") or {}
    if epochs:
        lines += ["Cavs's epoch (s) at the baseline: " + ", ".join(
            f"{WORKLOADS.get(w, w)} {_seconds(v)}" for w, v in sorted(epochs.items())) + ".", ""]
    return lines


def others_section(results: Path) -> list[str]:
    extra = sorted(p for p in results.iterdir() if p.is_file() and p.name not in KNOWN_FILES
                   and not p.name.endswith(".lock"))
    if not extra:
        return []
    lines = ["## Other files", ""]
    for p in extra:
        if p.suffix == ".csv":
            df = read_csv(p)
            lines.append(f"- `{p.name}`: {_rows(len(df))}, measured at: {commits(df)}.")
        else:
            lines.append(f"- `{p.name}`")
    return lines + [""]


def report(results) -> str:
    results = Path(results)
    kind, env_lines = machine(results)
    present_sweeps = [s for s in SWEEPS if (results / f"{s.name}.csv").exists()]
    present_studies = [s for s in STUDIES if (results / (s.file or f"{s.name}.csv")).exists()]
    lines = [f"# Results: `{results.name}`", "",
             "Generated by `python -m plots.report` from the files in this directory; do not edit by hand "
             "(hand-written commentary goes in `notes.md`, included under Notes).", "",
             f"Machine kind: **{kind}**.", ""]
    lines += [*(f"- {line}" for line in env_lines), ""] if env_lines else []
    files = []
    for s in present_sweeps:
        df = read_csv(results / f"{s.name}.csv")
        files.append((s.name, f"`{s.name}.csv`", len(df), commits(df)))
    for s in present_studies:
        name = s.file or f"{s.name}.csv"
        df = _markdown_table((results / name).read_text()) if name.endswith(".md") else read_csv(results / name)
        files.append((s.name, f"`{name}`", len(df), commits(df, "commit" if name.endswith(".md") else "git_rev")))
    if files:
        lines += ["| result | file | rows | measured at |", "| --- | --- | --- | --- |"]
        lines += [f"| {n} | {f} | {r} | {c} |" for n, f, r, c in files]
        lines += [""]
    else:
        lines += ["No figure, table or study has been measured into this directory yet.", ""]
    lines += claims_section(results)
    for s in present_sweeps:
        lines += sweep_section(results, s)
    for s in present_studies:
        lines += study_section(results, s)
    lines += ci_section(results)
    lines += others_section(results)
    notes = results / "notes.md"
    if notes.exists():
        lines += ["## Notes", "", "From `notes.md`, written by hand.", "", notes.read_text().rstrip("\n"), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def write(results) -> Path:
    out = Path(results) / "REPORT.md"
    out.write_text(report(results))
    return out


# ---------------------------------------------------------------- the README's claims block

def claims_block(results) -> str:
    """What goes between the README's markers: the claims table and where it came from."""
    results = Path(results)
    revs = []
    for name in ("fig8", "fig9", "ablation"):
        if (results / f"{name}.csv").exists():
            df = read_csv(results / f"{name}.csv")
            if "git_rev" in df:
                revs += [r.removesuffix("-dirty") for r in df["git_rev"].dropna().astype(str)]
    commit = ", ".join(f"`{r}`" for r in dict.fromkeys(revs)) or "not recorded"
    kind, _ = machine(results)
    return (f"{claims(results).rstrip()}\n\n"
            f"Measured on {kind} (`{results.as_posix()}/`), commit {commit}; generated by "
            f"`python -m plots.report --results {results.as_posix()} --update-readme`.")


def update_readme(readme, results) -> None:
    readme = Path(readme)
    text = readme.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} block to replace")
    start += len(BEGIN)
    readme.write_text(text[:start] + "\n" + claims_block(results) + "\n" + text[end:])


def kind_dirs(root=ROOT) -> list[Path]:
    return sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m plots.report", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--results", help="one machine kind's results directory, e.g. results/amd-epyc-2cpu-24gib")
    where.add_argument("--all", action="store_true", help="every kind directory under --root")
    parser.add_argument("--root", default=str(ROOT), help="with --all: the results root (default results)")
    parser.add_argument("--update-readme", nargs="?", const="README.md", metavar="README",
                        help="also rewrite the block between the README's claims markers with this "
                             "directory's claims table (default README.md)")
    args = parser.parse_args(argv)
    if args.update_readme and args.all:
        parser.error("--update-readme takes one directory: use --results")
    dirs = kind_dirs(args.root) if args.all else [Path(args.results)]
    for d in dirs:
        if not d.is_dir():
            parser.error(f"{d} is not a directory")
        print(write(d))
    if args.update_readme:
        update_readme(args.update_readme, dirs[0])
        print(f"{args.update_readme}: claims block from {dirs[0]}")


if __name__ == "__main__":
    sys.exit(main())
