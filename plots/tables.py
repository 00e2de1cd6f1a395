"""Tables (registry `plot["kind"] == "table"`): rows = the registry's row columns, one column per
system and value, times per epoch in seconds; `*` marks an extrapolated number."""
from __future__ import annotations

import pandas as pd


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
    lines += [n for n in notes if n]
    (out_dir / f"{exp.name}.md").write_text("\n".join(lines) + "\n")
    return [out_dir / f"{exp.name}.md", out_dir / f"{exp.name}.csv"]
