"""Checks the `cpu` profile's extrapolation: for each cell below, the cpu-profile cell (a slice of the epoch,
per-epoch time extrapolated) and a long measurement of the same cell (the whole epoch where that costs
under about a minute here, else twenty times the slice's samples, a contiguous block of the shuffled
epoch, whose own sampling error is then a few percent), each in its own process like a sweep's cells;
writes RESULTS/extrapolation.csv and fails when an extrapolation is off by more than --max-error
(default 15%).

    python -m experiments.studies extrapolation [--results results] [--only 1,5,...] [--list]
    python -m experiments.studies extrapolation --slice first --warmup last   # the harness's former slice choice
    python -m experiments.studies extrapolation --cells cavs:var_lstm:1:512,cavs:var_lstm:2:512 \
        --out neighbours.csv     # Figure 8 cells that break their curves, reproduced with runs 10x the slice

About 11-15 minutes on a quiet 2-core machine (`--list` prints the cells and the cost model's guesses).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .. import arguments, environment, launch, runner
from ..profiles import (DEFAULT_STARTUP_S, STARTUP_S, estimated_cell_s, get_profile, measured_samples,
                       sample_cost_s)

# (system, workload, batch_size, hidden, long): long = "epoch" (the whole epoch) or a multiple of the slice.
# Chosen to cover every kind of system (batched engine, DyNet, TensorFlow, cuDNN-LSTM, Fold, per-sample
# PyTorch and Cavs-serial), the four workloads, h = 64 ... 1024 and bs = 1 ... 256, within the time budget.
CELLS = (
    ("cavs", "tree_lstm", 64, 512, "epoch"),
    ("cavs", "tree_lstm", 1, 512, 20),
    ("cavs", "tree_fc", 64, 1024, 20),
    ("cavs", "var_lstm", 256, 512, 20),
    ("cavs-serial", "tree_lstm", 16, 512, 20),
    ("dynet", "tree_lstm", 64, 128, "epoch"),
    ("dynet", "tree_lstm", 1, 512, 20),
    ("dynet", "tree_fc", 256, 512, 20),
    ("tensorflow", "fixed_lstm", 1, 512, 20),
    ("tensorflow", "var_lstm", 64, 256, 20),
    ("cudnn", "fixed_lstm", 8, 512, 20),
    ("fold", "tree_lstm", 256, 512, "epoch"),
    ("fold", "tree_fc", 64, 64, "epoch"),
    ("pytorch", "tree_lstm", 1, 512, 20),
    ("pytorch", "tree_fc", 4, 512, 20),
)
COLUMNS = ("system", "workload", "mode", "batch_size", "hidden", "leaves", "slice", "warmup",
           "slice_samples", "slice_total_s", "long_samples", "long_total_s", "long_is_epoch", "epoch_samples",
           "extrapolated_epoch_s", "measured_epoch_s", "rel_error", "status", "ftz", "git_rev", "timestamp")


def cell_spec(system, workload, bs, hidden, *, samples, slice_how, warmup_how, threads=1, repeats=None) -> dict:
    """The `cpu` profile's cell, or with `samples` and `repeats` given, the long run's (one pass: its
    length averages the VM's spells)."""
    profile = get_profile("cpu")
    cell = {"experiment": "extrapolation", "panel": "x", "workload": workload, "system": system,
            "variant": "default", "options": {}, "mode": "train", "batch_size": bs, "hidden": hidden,
            "leaves": 256, "threads": threads, "device": "cpu", "profile": profile.name,
            "warmup_batches": profile.warmup_batches, "repeats": repeats or profile.repeats}
    cell["samples"] = measured_samples(profile, cell) if samples == "cpu" else samples
    cell["slice"], cell["warmup"] = slice_how, warmup_how
    cell["cell_id"] = f"extrapolation-{system}-{workload}-{bs}-{hidden}-{slice_how}-{samples}"
    return cell


def long_samples(slice_samples: int, bs: int, long, epoch_samples: int) -> int | None:
    """The long measurement's samples (whole batches); None = the whole epoch."""
    if long == "epoch" or slice_samples * long >= epoch_samples:
        return None
    return -(-slice_samples * long // bs) * bs


def check_cell(entry, results_dir: Path, slice_how: str, warmup_how: str) -> dict:
    system, workload, bs, hidden, long = entry
    row = {"system": system, "workload": workload, "mode": "train", "batch_size": bs, "hidden": hidden,
           "leaves": 256, "slice": slice_how, "warmup": warmup_how, "ftz": environment.ftz_requested(),
           "git_rev": environment.git_revision(), "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    log_dir = results_dir / "logs"
    short = cell_spec(system, workload, bs, hidden, samples="cpu", slice_how=slice_how, warmup_how=warmup_how)
    first = launch.run_cell(short, get_profile("cpu").time_limit_s, log_dir)
    if first["status"] != "ok":
        return {**row, "status": f"slice {first['status']}"}
    epoch = int(first["epoch_samples"])
    n = long_samples(first["samples"], bs, long, epoch)
    # the reference: a contiguous block of the shuffled epoch (a plain random sample), or all of it
    ref = cell_spec(system, workload, bs, hidden, samples=n, slice_how="first", warmup_how=warmup_how, repeats=1)
    guess_s = first["total_s"] * (n or epoch) / first["samples"]
    second = launch.run_cell(ref, 120 + 4 * guess_s, log_dir)
    if second["status"] != "ok":
        return {**row, "slice_samples": first["samples"], "status": f"long {second['status']}"}
    err = first["epoch_s"] / second["epoch_s"] - 1
    return {**row, "slice_samples": first["samples"], "slice_total_s": round(first["total_s"], 4),
            "long_samples": second["samples"], "long_total_s": round(second["total_s"], 4),
            "long_is_epoch": not second["extrapolated"], "epoch_samples": second["epoch_samples"],
            "extrapolated_epoch_s": round(first["epoch_s"], 3), "measured_epoch_s": round(second["epoch_s"], 3),
            "rel_error": round(err, 4), "status": "ok"}


def estimate_s(entry) -> float:
    """The cost model's guess of one check: the cpu cell, then the long run (start-ups included)."""
    system, workload, bs, hidden, long = entry
    profile = get_profile("cpu")
    cell = cell_spec(system, workload, bs, hidden, samples="cpu", slice_how="spread", warmup_how="largest")
    epoch = runner.EPOCH_SAMPLES[workload] // bs * bs
    n = long_samples(cell["samples"], bs, long, epoch) or epoch
    per_sample = sample_cost_s(system, workload, hidden, 256, "train", bs)
    startup = STARTUP_S.get(system, DEFAULT_STARTUP_S)
    return estimated_cell_s(profile, cell, epoch) + startup + (n + bs) * per_sample


def add_arguments(parser) -> None:
    parser.add_argument("--only", type=arguments.counts, help="comma-separated cell numbers (see --list), e.g. 1,6,9")
    parser.add_argument("--list", action="store_true", help="print the cells and exit")
    parser.add_argument("--max-error", type=arguments.at_least_zero, default=0.15)
    parser.add_argument("--slice", default="spread", choices=("spread", "first"), help="the slice under test")
    parser.add_argument("--warmup", default="largest", choices=("largest", "last"))
    parser.add_argument("--cells", type=parse_cells,
                        help="other cells instead of the built-in ones, comma-separated "
                             "system:workload:bs:h[:long] (long: a multiple of the slice, default 10, or 'epoch')")
    parser.add_argument("--out", help="file name under RESULTS (default extrapolation.csv)")


def parse_cells(text: str) -> tuple:
    """'cavs:var_lstm:1:512,dynet:var_lstm:2:512:epoch' -> CELLS-like entries (long 10 unless given)."""
    import argparse
    from ..registry import SYSTEM_FACTS as SYSTEMS, WORKLOAD_TITLES as WORKLOADS
    cells = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        parts = item.split(":")
        try:
            system, workload, bs, hidden = parts[0], parts[1], int(parts[2]), int(parts[3])
            long = 10 if len(parts) == 4 else ("epoch" if parts[4] == "epoch" else int(parts[4]))
            if len(parts) > 5 or bs < 1 or hidden < 1 or (long != "epoch" and long < 2):
                raise ValueError
        except (IndexError, ValueError):
            raise argparse.ArgumentTypeError(
                f"{item!r} is not system:workload:bs:h[:long] (bs, h whole numbers; long >= 2 or 'epoch')")
        if system not in SYSTEMS or workload not in WORKLOADS:
            raise argparse.ArgumentTypeError(
                f"{item!r}: unknown {'system' if system not in SYSTEMS else 'workload'} "
                f"{system if system not in SYSTEMS else workload!r} (systems: {', '.join(sorted(SYSTEMS))}; "
                f"workloads: {', '.join(sorted(WORKLOADS))})")
        cells.append((system, workload, bs, hidden, long))
    if not cells:
        raise argparse.ArgumentTypeError("no cell given")
    return tuple(cells)


def main(results_dir: Path, args) -> int:
    cells = args.cells or CELLS
    chosen = args.only or list(range(1, len(cells) + 1))
    beyond = [i for i in chosen if i > len(cells)]
    if beyond:
        print(f"--only: no cell {', '.join(map(str, beyond))}; there are {len(cells)} (see --list)", file=sys.stderr)
        return 2
    if args.list:
        total = 0.0
        for i, c in enumerate(cells, 1):
            guess = estimate_s(c)
            total += guess if i in chosen else 0
            print(f"{i:>3}  {c[0]:<12} {c[1]:<11} bs={c[2]:<4} h={c[3]:<5} long={c[4]:<6} ~{guess / 60:4.1f} min")
        print(f"cells {','.join(map(str, chosen))}: ~{total / 60:.0f} min (cost model of profiles.py, 2-core reference)")
        return 0
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / (args.out or "extrapolation.csv")
    rows, bad = [], []
    for i in chosen:
        entry = cells[i - 1]
        if runner.unavailable(entry[0], "cpu"):
            print(f"skipped {entry[0]}: {runner.unavailable(entry[0], 'cpu')}", file=sys.stderr)
            continue
        t0 = time.monotonic()
        row = check_cell(entry, results_dir, args.slice, args.warmup)
        rows.append(row)
        launch.write_rows(path, rows, list(COLUMNS))    # after every cell: a killed check keeps what it measured
        ok = row["status"] == "ok" and abs(row["rel_error"]) <= args.max_error
        if not ok:
            bad.append(row)
        print(f"{i:>3} {entry[0]:<12} {entry[1]:<11} bs={entry[2]:<4} h={entry[3]:<5} "
              + (f"slice {row['slice_samples']:>5} -> {row['extrapolated_epoch_s']:>9.2f} s, "
                 f"long {row['long_samples']:>5}{' (epoch)' if row['long_is_epoch'] else ''} -> "
                 f"{row['measured_epoch_s']:>9.2f} s, error {row['rel_error']:+.1%}"
                 if row["status"] == "ok" else row["status"])
              + f"  [{time.monotonic() - t0:.0f} s]" + ("" if ok else "  <-- FAIL"), flush=True)
    print(f"wrote {path}")
    if bad:
        print(f"FAILED: {len(bad)} of {len(rows)} cells off by more than {args.max_error:.0%} or not measured",
              file=sys.stderr)
        return 1
    return 0
