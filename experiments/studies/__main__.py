"""`python -m experiments.studies NAME [--results DIR] [options]`: runs study NAME (its options:
`python -m experiments.studies NAME --help`); `... NAME --cell JSON` is one of its measuring
processes (launch.run starts them), which prints its result line."""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from .. import launch

STUDIES = ("bench", "nary", "task_cost", "targets", "startup", "policies", "extrapolation", "ray_walltime", "sst",
           "torch_module")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    choose = argparse.ArgumentParser(prog="python -m experiments.studies",
                                     description=importlib.import_module(__package__).__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    choose.add_argument("study", choices=STUDIES)
    name = choose.parse_args(argv[:1]).study
    # only the chosen study is imported: a measuring process loads nothing another study needs
    study = importlib.import_module(f"{__package__}.{name}")
    parser = argparse.ArgumentParser(prog=f"python -m experiments.studies {name}", description=study.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("results"), help="the results directory (default: results)")
    if hasattr(study, "cell"):
        parser.add_argument("--cell", help=argparse.SUPPRESS)
    study.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    if getattr(args, "cell", None):
        launch.die_with_parent()
        launch.emit(study.cell(json.loads(args.cell)))
        return 0
    return study.main(args.results, args) or 0


if __name__ == "__main__":
    sys.exit(main())
