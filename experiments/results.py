"""The long-format results CSV of one experiment: one row per measured cell, appended atomically.

Each row is one os.write on an O_APPEND descriptor, made under an exclusive lock after checking that
its cell id is not there yet: a runner killed at any moment leaves only whole rows, and a rerun (or a
second runner) never duplicates a cell.
"""
from __future__ import annotations

import csv
import fcntl
import io
import os
from contextlib import contextmanager
from pathlib import Path

COLUMNS = (
    "experiment", "panel", "workload", "system", "variant", "options", "mode", "batch_size", "hidden",
    "leaves", "threads", "backend", "device", "samples", "epoch_samples", "construct_s", "compute_s",
    "memory_s", "total_s", "epoch_s", "extrapolated", "loss", "status", "git_rev", "profile", "cell_id",
    "timestamp",
)


def csv_path(results_dir, experiment: str) -> Path:
    return Path(results_dir) / f"{experiment}.csv"


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def done_ids(path: Path) -> set[str]:
    return {row["cell_id"] for row in read_rows(path)}


def _format(values) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(values)
    return buf.getvalue().encode()


def append_row(path: Path, row: dict) -> bool:
    """Appends `row` unless its cell is already recorded; False when it was."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"not result columns: {sorted(unknown)}")
    with _locked(path):
        exists = path.exists() and path.stat().st_size > 0
        if exists and row["cell_id"] in done_ids(path):
            return False
        data = (b"" if exists else _format(COLUMNS)) + _format(["" if row.get(c) is None else row[c]
                                                                 for c in COLUMNS])
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return True


def drop_failed(path: Path) -> int:
    """Removes the rows of failed cells (write a temporary file, rename it over), so they run again."""
    with _locked(path):
        rows = read_rows(path)
        keep = [r for r in rows if r["status"] == "ok"]
        if len(keep) == len(rows):
            return 0
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(_format(COLUMNS) + b"".join(_format([r.get(c, "") for c in COLUMNS]) for r in keep))
        os.replace(tmp, path)
    return len(rows) - len(keep)
