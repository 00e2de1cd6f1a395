"""Reads an experiment's long-format CSV for plotting: one profile, ok rows scaled to one epoch."""
from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pandas as pd

TIME_COLUMNS = ("construct_s", "compute_s", "memory_s", "computation_s", "total_s")
MEMORY_COLUMNS = ("peak_rss_mb", "gpu_peak_mb")     # per cell process, not scaled
TEXT_COLUMNS = {"git_rev": str, "commit": str}      # a short commit id like 3010e33 would parse as 3.01e+36


def read_csv(path) -> pd.DataFrame:
    """A results CSV with its commit columns kept as text. A line with another number of fields
    than the header (a hand edit, a write cut short) is left out with a warning that names the
    file and the line: one bad line must not take the file's other rows with it (it made the
    newest row's profile NaN, and a whole figure "no rows")."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        bad = [reader.line_num for fields in reader if fields and len(fields) != len(header)]
    if bad:
        warnings.warn(f"{path}: line{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad[:10]))}"
                      f"{' ...' if len(bad) > 10 else ''} do{'' if len(bad) > 1 else 'es'} not have the "
                      f"header's {len(header)} fields; left out", stacklevel=2)
    return pd.read_csv(path, dtype=TEXT_COLUMNS, skiprows=[n - 1 for n in bad])


def load(results_dir, experiment: str, profile: str | None = None):
    """(ok rows, failed rows, profile). Times of ok rows are per epoch (measured slice scaled up);
    computation_s = compute_s - memory_s. Default profile: the one of the newest row."""
    path = Path(results_dir) / f"{experiment}.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; run `python -m experiments run {experiment}` first")
    df = read_csv(path)
    if profile is None:
        profile = df.sort_values("timestamp")["profile"].iloc[-1]
    df = df[df["profile"] == profile]
    if df.empty:
        raise ValueError(f"{path} has no rows of profile {profile!r}")
    for col in MEMORY_COLUMNS:           # rows written before the harness recorded memory
        if col not in df:
            df[col] = float("nan")
    ok = df[df["status"] == "ok"].copy()
    ok["extrapolated"] = ok["extrapolated"].astype(str) == "True"
    ok["computation_s"] = ok["compute_s"] - ok["memory_s"]
    scale = ok["epoch_samples"] / ok["samples"]
    for col in TIME_COLUMNS:
        ok[col] = ok[col] * scale
    return ok, df[df["status"] != "ok"], profile


def failure_note(failed, vary_of_panel: dict, limit: int = 8) -> str:
    """One footnote listing failed cells as `(panel) system x=value [variant] [mode]: reason`."""
    items = []
    for r in failed.itertuples():
        vary = vary_of_panel.get(r.panel, "batch_size")
        extra = "".join(f" {v}" for v in (r.variant, r.mode) if v not in ("default", "train"))
        reason = r.status if len(r.status) <= 90 else r.status[:87] + "..."
        items.append(f"({r.panel}) {r.system} {vary}={getattr(r, vary)}{extra}: {reason}")
    if not items:
        return ""
    more = f"; and {len(items) - limit} more" if len(items) > limit else ""
    return "Missing (failed) cells: " + "; ".join(items[:limit]) + more
