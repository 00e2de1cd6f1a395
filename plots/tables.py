"""Tables (registry `plot["kind"] == "table"`): rows = the registry's row columns, one column per
system and value, times per epoch in seconds; `*` marks an extrapolated number."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from experiments.registry import WORKLOAD_TITLES


def _cell(s, key, value) -> str:
    """`-` = not measured (failed or not run), `n/a` = the system cannot measure it (e.g. DyNet memory)."""
    if key not in s.index:
        return "-"
    x = s.loc[key, value]
    return "n/a" if pd.isna(x) else f"{x:.3g}{'*' if s.loc[key, 'extrapolated'] else ''}"


def build(exp, ok) -> pd.DataFrame:
    rows = list(exp.plot["rows"])
    train_first = {"train": 0, "infer": 1}
    out = ok[rows].drop_duplicates().sort_values(
        rows, key=lambda col: col.map(train_first) if col.name == "mode" else col).reset_index(drop=True)
    for system in exp.systems:
        for value in exp.plot["values"]:
            s = ok[ok["system"] == system].set_index(rows)
            out[f"{system} {value}"] = [_cell(s, k, value) for k in map(tuple, out[rows].to_numpy())]
    return out


def markdown(df: pd.DataFrame) -> str:
    header = "| " + " | ".join(df.columns) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def write(exp, ok, notes, profile, out_dir):
    df = build(exp, ok)
    df.to_csv(out_dir / f"{exp.name}.csv", index=False)
    lines = [f"## {exp.title}", "", f"Seconds per epoch, profile `{profile}`.", "", markdown(df), ""]
    if ok["extrapolated"].any():
        lines.append("`*` extrapolated from a measured slice of the epoch (time per sample x epoch samples); "
                     "`-` not measured; `n/a` not measurable by that system.")
    if exp.name == "table2":
        lines.append(dynet_memory_note(Path(out_dir).parent))
    lines += [n for n in notes if n]
    (out_dir / f"{exp.name}.md").write_text("\n".join(lines) + "\n")
    return [out_dir / f"{exp.name}.md", out_dir / f"{exp.name}.csv"]


def dynet_memory_note(results_dir) -> str:
    """How Table 2's DyNet memory_s was measured, and why it is n/a where it is."""
    env = Path(results_dir) / "environment.json"
    how = json.loads(env.read_text()).get("dynet_memory_profiler") if env.exists() else None
    return ("DyNet's memory_s is sampled, not timed (experiments/memprofile.py): `perf record -g` over an "
            "extra untimed pass of the cell's batches; the share of samples in the autobatcher's input "
            "gathers and gradient scatters (combine_tensors, accumulate_tensors and their memcpy) and the "
            "embedding lookup and its gradient, scaled to the timed pass's compute_s. `n/a` where perf could "
            "not sample" + (f"; this sweep's machine: {how}." if how else "."))


# ---------------------------------------------------------------- peak memory (Figure 8's h sweeps)

MEMORY_NOTE = ("Peak resident memory (ru_maxrss) of each cell's process, in MB: interpreter, framework "
               "libraries, the data set, parameters, activations and buffers, warm-up and timed slice "
               "included. DyNet reserves its memory pool when it starts (sized from the workload, at least "
               "1 GB: baselines/dynet_autobatch.py `pool_mb`) and touches it, so its number is the reserved "
               "pool plus the rest, not what its graphs used. Fold-N's worker processes are not included. "
               "On a GPU, gpu_peak_mb is the framework allocator's peak (PyTorch's caching allocator, CuPy's "
               "pool), without the CUDA context.")


def memory_table(exp, ok, value: str = "peak_rss_mb") -> pd.DataFrame:
    """Rows (workload, h) of the experiment's hidden-size panels, one column per system."""
    panels = [p for p in exp.panels if p.vary == "hidden"]
    rows = []
    for panel in panels:
        data = ok[(ok["panel"] == panel.id) & ok[value].notna()]
        for h in panel.values:
            row = {"workload": WORKLOAD_TITLES[panel.workload], "batch_size": panel.batch_size, "hidden": h}
            for system in exp.systems:
                cell = data[(data["system"] == system) & (data["hidden"] == h)]
                row[system] = f"{cell[value].iloc[-1]:.0f}" if len(cell) else "-"
            rows.append(row)
    df = pd.DataFrame(rows)
    keep = [c for c in df.columns if c in ("workload", "batch_size", "hidden") or (df[c] != "-").any()]
    df = df[keep]
    measured = (df[keep[3:]] != "-").any(axis=1) if len(keep) > 3 else df["hidden"] < 0
    return df[measured].reset_index(drop=True)


def write_memory(exp, ok, notes, profile, out_dir) -> list:
    df = memory_table(exp, ok)
    df.to_csv(out_dir / "memory.csv", index=False)
    lines = [f"## Peak memory per cell process (MB), {exp.name}'s hidden-size sweeps", "",
             f"Profile `{profile}`; `-` not measured.", "", markdown(df), "", MEMORY_NOTE]
    if ok["gpu_peak_mb"].notna().any():
        lines += ["", "GPU (MB):", "", markdown(memory_table(exp, ok, "gpu_peak_mb"))]
    lines += [n for n in notes if n]
    (out_dir / "memory.md").write_text("\n".join(lines) + "\n")
    return [out_dir / "memory.md", out_dir / "memory.csv"]
