"""Fake systems for the harness's tests: they sleep instead of computing, so sweeps, cells and
executors are tested without the engine or the baselines. Cell subprocesses import them by name
(FAKE, MARKED: experiments/cell.py), with the repository on PYTHONPATH (tests/conftest.py
importable_fake; the Ray cluster of test_ray.py)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from baselines.base import System
from experiments import registry, results
from experiments.profiles import Profile

FAKE = "tests.harness.fake_system:FakeSystem"      # a System by import path (experiments/cell.py)
MARKED = "tests.harness.fake_system:MarkedSystem"
SLOW_FIRST_USE = "tests.harness.fake_system:SlowFirstUse"
PROFILE = Profile("test", "cpu", time_limit_s=20, timed_batches=2, target_s=None, reduced_grid=False)


class FakeSystem(System):
    """Sleeps instead of computing; options make it crash or hang."""
    name = "fake"

    def __init__(self, workload, *, sleep_ms=2.0, crash=False, hang=False, **kwargs):
        super().__init__(workload, **kwargs)
        self.sleep_s, self.crash, self.hang = sleep_ms / 1000, crash, hang
        self.timings.memory_s = 0.0

    def prepare(self, samples):
        with self.timings.timing("construct_s"):
            time.sleep(self.sleep_s / 4)
        return samples

    def step(self, batch):
        if self.crash:
            raise RuntimeError("fake crash")
        if self.hang:
            time.sleep(3600)
        with self.timings.timing("compute_s"):
            time.sleep(self.sleep_s)
        return 1.0


class MarkedSystem(FakeSystem):
    """A fake system that leaves a file per run in `marks`: its pid, its parent's (the Ray worker) and
    when it started and ended its timed step."""
    def __init__(self, workload, *, marks, **kwargs):
        super().__init__(workload, **kwargs)
        self.marks = Path(marks)
        self.mark = self.marks / f"{os.getpid()}.json"
        self._write({"worker": os.getppid(), "cell": self.batch_size, "start": time.time()})

    def _write(self, facts: dict):
        """Whole or not at all: a test polls for the file and reads it at once (write_text creates
        it empty first, and a test once read it so)."""
        tmp = self.marks / f".{os.getpid()}.tmp"
        tmp.write_text(json.dumps(facts))
        os.replace(tmp, self.mark)

    def step(self, batch):
        loss = super().step(batch)
        self._write({**json.loads(self.mark.read_text()), "end": time.time()})
        return loss


class SlowFirstUse(FakeSystem):
    """A fake system whose first construction on a machine (no file `measured` in `machine` yet) takes
    `first_use_s`, as the engine's GEMM measurement does; later constructions find the file."""
    def __init__(self, workload, *, machine, first_use_s, **kwargs):
        super().__init__(workload, **kwargs)
        measured = Path(machine) / "measured"
        if not measured.exists():
            time.sleep(first_use_s)
            measured.write_text(str(os.getpid()))


def experiment(system, values, variants=(("default", {}),), title="fake"):
    panel = registry.Panel("a", "tree_fc", (system,), "batch_size", values, hidden=8, leaves=8, variants=variants)
    return registry.Experiment("fake", title, (panel,), {"kind": "lines", "y": "epoch_s", "layout": (1, 1)})


def fake_experiment(variants=(("default", {}),), values=(2, 4)):
    return experiment(FAKE, values, variants, title="fake experiment")


def rows_of(results_dir, name="fake"):
    return results.read_rows(results.csv_path(results_dir, name))
