"""One sweep cell, in its own process: `python -m experiments.cell '<json spec>'`.

Builds the system, warms it up on one batch (untimed), then times prepare() + step() over the measured
batches (`repeats` times, keeping the fastest pass) and prints one line `CELL_RESULT {json}`. The runner
sets the BLAS libraries' thread variables in this process's environment; the system sets its framework's.

A system is a name of the baselines registry, or `package.module:Class` (a base.System subclass,
used by the tests' fake system).
"""
from __future__ import annotations

import ctypes
import dataclasses
import importlib
import json
import math
import os
import signal
import sys
import time
import traceback

RESULT_MARK = "CELL_RESULT "


def _die_with_parent():
    """A runner killed with SIGKILL cannot stop its cells; Linux can: kill this process with it."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:                              # the parent died before prctl took effect
        os._exit(1)


def system_factory(name: str):
    if ":" in name:
        module, cls = name.split(":")
        klass = getattr(importlib.import_module(module), cls)
        return lambda workload, **kw: klass(workload, **kw)
    from baselines import get_system
    return get_system(name)


def _backend(system, name: str) -> str:
    """What computes: the engine's backend (numpy/cupy) for Cavs, else the system's framework."""
    from .registry import SYSTEM_FACTS
    backend = system.timings.extra.get("backend") or getattr(system, "backend", None)
    return str(getattr(backend, "name", backend) or SYSTEM_FACTS.get(name, ("",))[0] or "")


def measure(spec: dict) -> dict:
    from cavs.datasets import load_samples, shuffled

    bs = spec["batch_size"]
    samples = load_samples(spec["workload"], "train", leaves=spec["leaves"])
    if spec.get("order", "shuffled") == "shuffled":     # WORKLOADS.md; experiments.bench uses file order
        samples = shuffled(samples, seed=0)
    batches = [samples[i:i + bs] for i in range(0, len(samples) - bs + 1, bs)]   # last partial batch dropped
    epoch_samples = len(batches) * bs
    timed = len(batches) if spec["samples"] is None else min(len(batches), math.ceil(spec["samples"] / bs))

    system = system_factory(spec["system"])(
        spec["workload"], hidden=spec["hidden"], batch_size=bs, mode=spec["mode"], dtype="float32",
        threads=spec["threads"], seed=0, leaves=spec["leaves"], device=spec["device"], **spec["options"])
    backend = _backend(system, spec["system"])          # before timings.reset() clears timings.extra
    for batch in batches[len(batches) - spec["warmup_batches"]:]:    # warm up off the timed slice
        system.step(system.prepare(batch))
    system.synchronize()

    best = None
    for _ in range(spec["repeats"]):      # the fastest pass: other load on a shared machine only slows one down
        system.timings.reset()
        t0 = time.perf_counter()
        for batch in batches[:timed]:
            loss = system.step(system.prepare(batch))
        system.synchronize()
        total = time.perf_counter() - t0
        if best is None or total < best[0]:
            best = (total, dataclasses.replace(system.timings), loss)

    total, t, loss = best
    measured = timed * bs
    return {"backend": backend, "samples": measured, "epoch_samples": epoch_samples,
            "construct_s": t.construct_s, "compute_s": t.compute_s, "memory_s": t.memory_s,
            "total_s": total, "epoch_s": total / measured * epoch_samples,
            "extrapolated": measured < epoch_samples, "loss": float(loss), "status": "ok"}


def failure_reason(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "failed: out of memory (MemoryError)"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"failed: {type(exc).__name__}: {message}"[:300]


def main(argv):
    _die_with_parent()
    spec = json.loads(argv[1])
    try:
        result = measure(spec)
    except Exception as exc:      # any failure of the system is this cell's result, not a crash of the sweep
        traceback.print_exc()
        result = {"status": failure_reason(exc)}
    print(RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv)
