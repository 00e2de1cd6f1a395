"""`python -m plots EXPERIMENT --results DIR [--profile P]`: DIR/figures/<experiment>.png/.pdf or .md/.csv."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.registry import EXPERIMENTS
from . import figures, tables
from .load import failure_note, load


def render(experiment: str, results_dir, profile: str | None = None) -> list[Path]:
    exp = EXPERIMENTS[experiment]
    ok, failed, profile = load(results_dir, experiment, profile)
    out_dir = Path(results_dir) / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    notes = [failure_note(failed, {p.id: p.vary for p in exp.panels})]
    if exp.plot["kind"] == "table":
        return tables.write(exp, ok, notes, profile, out_dir)
    fig = figures.KINDS[exp.plot["kind"]](exp, ok, notes + [f"Profile: {profile}."])
    fig.suptitle(exp.title, fontsize=10, y=0.995)
    paths = [out_dir / f"{experiment}.png", out_dir / f"{experiment}.pdf"]
    for path in paths:      # no creation date in the PDF: redrawing the same rows changes no file
        fig.savefig(path, dpi=150, metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m plots", description=__doc__)
    parser.add_argument("experiment", choices=list(EXPERIMENTS))
    parser.add_argument("--results", default="results", help="directory of the CSVs (default: results)")
    parser.add_argument("--profile", help="which profile's rows to draw (default: that of the newest row)")
    args = parser.parse_args(argv)
    try:
        paths = render(args.experiment, args.results, args.profile)
    except (FileNotFoundError, ValueError) as exc:
        parser.exit(2, f"python -m plots: error: {exc}\n")
    print("\n".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
