"""The long-format results CSV of one experiment: one row per measured cell, appended atomically.

Each row is one os.write on an O_APPEND descriptor, made under an exclusive lock after checking that
its cell id is not there yet: a runner killed at any moment leaves only whole rows, and a rerun (or a
second runner) never duplicates a cell. Only the sweep's driver writes (with the Ray executor, the cells'
results travel back to it). A CSV written before a column was added gets the new header (rewritten to a
temporary file and renamed over) the first time a row is appended to it.
"""
from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

COLUMNS = (
    "experiment", "panel", "workload", "system", "variant", "options", "mode", "batch_size", "hidden",
    "leaves", "threads", "backend", "device", "samples", "epoch_samples", "construct_s", "compute_s",
    "memory_s", "total_s", "epoch_s", "extrapolated", "loss", "status", "git_rev", "profile", "cell_id",
    "timestamp",
    "ftz", "peak_rss_mb", "gpu_peak_mb",   # the cell's flush-to-zero setting and peak memory (experiments/cell.py)
    "cpu_steal",                # the share of the kept pass's CPU time the host took (environment.steal_share)
    "blas",                     # the library of the system's matrix products (baselines' System.blas)
    "node", "machine",          # the host a cell ran on and its kind (experiments/machine.py)
)


def csv_path(results_dir, experiment: str) -> Path:
    return Path(results_dir) / f"{experiment}.csv"


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


SWEEP_LOCK = "sweep.lock"


@contextmanager
def exclusive(results_dir, what: str):
    """Holds `results_dir`'s sweep lock for the block: one measuring run per directory at a time.

    Two sweeps into one directory would run the same cells at once (the same log files, each the
    other's load) and measure nothing worth keeping, so the second is refused, naming the first (its
    pid, command and start time). The lock is an flock on RESULTS/sweep.lock: the kernel releases it
    when its holder dies, however it dies, so a lock left by a killed driver is simply taken over."""
    path = Path(results_dir) / SWEEP_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
            except ValueError:
                holder = {}
            sys.exit(f"{results_dir} is in use by another run: {holder.get('what', '?')} (pid "
                     f"{holder.get('pid', '?')}, started {holder.get('started', '?')}); wait for it to "
                     f"finish or stop it, then run again (a rerun resumes where it stopped)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "what": what,
                                  "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}).encode(), 0)
        yield
    finally:
        os.close(fd)          # releases the lock (and the kernel would, were this process killed)


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


def _header(path: Path) -> list[str] | None:
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, newline="") as f:
        return next(csv.reader(f), None)


def _rewrite(path: Path, header, rows) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(_format(header) + b"".join(_format([r.get(c) or "" for c in header]) for r in rows))
    os.replace(tmp, path)


def append_row(path: Path, row: dict) -> bool:
    """Appends `row` unless its cell is already recorded; False when it was."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"not result columns: {sorted(unknown)}")
    with _locked(path):
        header = _header(path)
        if header is not None:
            if row["cell_id"] in done_ids(path):
                return False
            wider = header + [c for c in COLUMNS if c not in header]
            if wider != header:          # a CSV from before a column was added: give it the new header
                _rewrite(path, wider, read_rows(path))
                header = wider
        data = (b"" if header else _format(COLUMNS)) + _format(["" if row.get(c) is None else row[c]
                                                                 for c in header or COLUMNS])
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
        _rewrite(path, _header(path), keep)
    return len(rows) - len(keep)
