"""One sweep per results directory at a time, and no cell outliving its driver."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import results, runner

from tests.harness import fake_system as fake   # the fake system and experiment of the harness tests

ROOT = Path(__file__).resolve().parents[2]
VALUES = tuple(range(1, 7))
pytestmark = pytest.mark.usefixtures("importable_fake")


def sweep(results_dir: Path, sleep_ms: float = 300.0) -> subprocess.Popen:
    """A driver in its own process: a fake sweep of six cells, each sleeping `sleep_ms` per step."""
    script = (f"import tests.harness.fake_system as t; from experiments import runner; "
              f"runner.run(t.fake_experiment(variants=(('slow', {{'sleep_ms': {sleep_ms}}}),), values={VALUES}), "
              f"t.PROFILE, {str(results_dir)!r}, progress=False)")
    return subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def running_cells(results_dir: Path) -> list[int]:
    """Pids of the slow fake cells still alive (their command line holds their spec)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "experiments.cell" in cmd and '"sleep_ms": 300.0' in cmd:
                pids.append(int(proc.name))
    return pids


def wait_for(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


@pytest.mark.slow
def test_a_second_sweep_into_the_same_directory_is_refused_naming_the_first(tmp_path):
    first = sweep(tmp_path)
    assert wait_for(lambda: (tmp_path / results.SWEEP_LOCK).exists() and running_cells(tmp_path))
    second = sweep(tmp_path)
    _, err = second.communicate(timeout=60)
    assert second.returncode == 1
    assert f"{tmp_path} is in use by another run: the fake sweep (test profile) (pid {first.pid}, started " in err
    first.communicate(timeout=120)
    assert first.returncode == 0
    ids = [r["cell_id"] for r in fake.rows_of(tmp_path)]
    assert len(ids) == len(set(ids)) == len(VALUES)
    assert all(r["status"] == "ok" for r in fake.rows_of(tmp_path))
    assert not list((tmp_path / "logs").glob("*.log"))       # the refused sweep touched no cell's log


@pytest.mark.slow
def test_a_killed_driver_leaves_no_cell_behind_and_its_lock_is_taken_over(tmp_path):
    driver = sweep(tmp_path)
    assert wait_for(lambda: len(fake.rows_of(tmp_path)) >= 2 and running_cells(tmp_path))
    cells = running_cells(tmp_path)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert wait_for(lambda: not running_cells(tmp_path), timeout=10), f"cells {cells} outlived their driver"
    before = len(fake.rows_of(tmp_path))
    assert 2 <= before < len(VALUES), "the driver should have been killed mid-sweep"
    holder = json.loads((tmp_path / results.SWEEP_LOCK).read_text())
    assert holder["pid"] == driver.pid                          # the stale lock's record is still there
    counts = runner.run(fake.fake_experiment(variants=(("slow", {"sleep_ms": 300.0}),), values=VALUES),
                        fake.PROFILE, tmp_path, progress=False)
    assert counts == {"already measured": before, "ok": len(VALUES) - before}
    ids = [r["cell_id"] for r in fake.rows_of(tmp_path)]
    assert len(ids) == len(set(ids)) == len(VALUES)
    assert json.loads((tmp_path / results.SWEEP_LOCK).read_text())["pid"] == os.getpid()
