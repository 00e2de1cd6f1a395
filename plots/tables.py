"""Tables (registry `plot["kind"] == "table"`): rows = the registry's row columns, one column per
system and value, times per epoch in seconds; `*` marks an extrapolated number."""
from __future__ import annotations

import pandas as pd


def build(exp, ok) -> pd.DataFrame:
    rows = list(exp.plot["rows"])
    train_first = {"train": 0, "infer": 1}
    out = ok[rows].drop_duplicates().sort_values(
        rows, key=lambda col: col.map(train_first) if col.name == "mode" else col).reset_index(drop=True)
    for system in exp.systems:
        for value in exp.plot["values"]:
            s = ok[ok["system"] == system].set_index(rows)
            cells = [f"{s.loc[k, value]:.3g}{'*' if s.loc[k, 'extrapolated'] else ''}" if k in s.index else "-"
                     for k in map(tuple, out[rows].to_numpy())]
            out[f"{system} {value}"] = cells
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
        lines.append("`*` extrapolated from a measured slice of the epoch (time per sample x epoch samples).")
    lines += [n for n in notes if n]
    (out_dir / f"{exp.name}.md").write_text("\n".join(lines) + "\n")
    return [out_dir / f"{exp.name}.md", out_dir / f"{exp.name}.csv"]
