"""`python -m plots EXPERIMENT --results DIR [--profile P]`: DIR/figures/<experiment>.png/.pdf or .md/.csv;
`python -m plots memory`: DIR/figures/memory.md/.csv/.png/.pdf (also drawn with fig8 when its rows have it)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.registry import EXPERIMENTS
from . import figures, tables
from .load import failure_note, load


MEMORY = "memory"          # not an experiment: Figure 8's hidden-size sweeps, peak memory per cell


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    for path in paths:      # no creation date in the PDF: redrawing the same rows changes no file
        fig.savefig(path, dpi=150, metadata={"CreationDate": None} if path.suffix == ".pdf" else None)
    return paths


def render_memory(results_dir, profile: str | None = None, source: str = "fig8") -> list[Path]:
    """RESULTS/figures/memory.{md,csv,png,pdf}: each system's peak memory across the h sweep (bs = 64)."""
    exp = EXPERIMENTS[source]
    ok, _, profile = load(results_dir, source, profile)
    if not ok["peak_rss_mb"].notna().any():
        raise ValueError(f"{Path(results_dir) / (source + '.csv')} has no peak_rss_mb yet: "
                         f"its rows predate the harness's memory column; measure them again")
    out_dir = Path(results_dir) / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = tables.write_memory(exp, ok, [], profile, out_dir)
    fig = figures.memory(exp, ok, [tables.MEMORY_NOTE, f"Profile: {profile}."])
    fig.suptitle("Peak resident memory per cell process vs hidden size, bs = 64", fontsize=10, y=0.995)
    return paths + _save(fig, out_dir, MEMORY)


def render(experiment: str, results_dir, profile: str | None = None) -> list[Path]:
    if experiment == MEMORY:
        return render_memory(results_dir, profile)
    exp = EXPERIMENTS[experiment]
    ok, failed, profile = load(results_dir, experiment, profile)
    out_dir = Path(results_dir) / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    notes = [failure_note(failed, {p.id: p.vary for p in exp.panels})]
    if exp.plot["kind"] == "table":
        return tables.write(exp, ok, notes, profile, out_dir)
    fig = figures.KINDS[exp.plot["kind"]](exp, ok, notes + [f"Profile: {profile}."])
    fig.suptitle(exp.title, fontsize=10, y=0.995)
    paths = _save(fig, out_dir, experiment)
    if experiment == "fig8" and ok["peak_rss_mb"].notna().any():     # `make fig8` draws the memory table too
        paths += render_memory(results_dir, profile)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m plots", description=__doc__)
    parser.add_argument("experiment", choices=list(EXPERIMENTS) + [MEMORY],
                        help="an experiment, or `memory` (peak memory across Figure 8's h sweeps)")
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
