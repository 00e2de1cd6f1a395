"""One sweep cell, in its own process: `python -m experiments.cell '<json spec>'`.

Sets the numeric environment (flush-to-zero and denormals-are-zero, on unless $CAVS_FTZ=0 or the spec's
`ftz` says otherwise) in the main thread before anything is imported, so every system and every thread
its framework starts computes under the same setting; sets it again after the system is built and
warmed up (DyNet's library turns FTZ/DAZ on when it is loaded, the Cavs engine calls
torch.set_flush_denormal).

Builds the system, warms it up (untimed) on the largest batch outside the timed slice, so that buffers
sized by the batch reach their epoch maximum before the clock starts (below 16 samples a batch, on the
largest two or three), then times prepare() + step()
over the slice's batches (`repeats` times, or more until `min_timed_s` has passed, keeping the fastest
pass) and prints one line
`CELL_RESULT {json}` with the result columns, and one line `CELL_EXTRA {json}` with what is not a
column (the denormal probe, the memory profiler's details). The runner sets the BLAS libraries' thread
variables in this process's environment; the system sets its framework's.

The slice (`samples` of the epoch, whole batches): `spread` (default) sorts the epoch's batches by their
work (vertices), cuts them into as many strata of equal count as the slice has batches and takes from
each the batch nearest its stratum's mean, so the slice's batch sizes follow the epoch's, mean included,
and come from all over the epoch; `first` takes the first batches of the shuffled epoch (a contiguous
block: the extrapolation check's reference, experiments/extrapolation.py). A spec with `order: file`
(experiments.bench: the first samples of the file) keeps `first` and a warm-up on the last batch.

A system is a name of the baselines registry, or `package.module:Class` (a base.System subclass,
used by the tests' fake system).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import resource
import sys
import time
import traceback

from . import environment, launch



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


# ---------------------------------------------------------------- which batches are timed

def sample_work(workload: str, sample) -> int:
    """A sample's vertices (its cost grows with them): tokens of a sentence, nodes of an SST tree."""
    if workload == "tree_lstm":
        return str(sample).count("(")              # one bracket per node
    if workload == "tree_fc":
        return 2 * len(sample[0]) - 1
    return len(sample) - 1                          # fixed/var LSTM: input tokens (the last is a target)


def pick_slice(work: list[int], count: int, how: str = "spread") -> list[int]:
    """Indices (in epoch order) of the `count` batches to time, of batches whose work is `work`."""
    n = len(work)
    if count >= n:
        return list(range(n))
    if how == "first":
        return list(range(count))
    if how != "spread":
        raise ValueError(f"unknown slice {how!r}: spread or first")
    order = sorted(range(n), key=lambda i: (work[i], i))
    picks = []
    for j in range(count):
        stratum = order[j * n // count:(j + 1) * n // count]
        mean = sum(work[i] for i in stratum) / len(stratum)
        picks.append(min(stratum, key=lambda i: (abs(work[i] - mean), i)))
    return sorted(picks)


def pick_warmup(work: list[int], timed: list[int], count: int, how: str = "largest") -> list[int]:
    """`largest` (default): the `count` largest batches outside the timed slice (of all batches when the
    slice is the whole epoch); `last`: the epoch's last batches (the harness's first choice, kept so the
    extrapolation check can compare)."""
    if count <= 0:
        return []
    if how == "last":
        return list(range(len(work)))[-count:]
    if how != "largest":
        raise ValueError(f"unknown warm-up {how!r}: largest or last")
    taken = set(timed)
    rest = [i for i in range(len(work)) if i not in taken] or list(range(len(work)))
    return sorted(sorted(rest, key=lambda i: (-work[i], i))[:count])


# ---------------------------------------------------------------- the numeric environment, checked

def _probe_values(np, vals) -> dict:
    each = [bool((np.asarray(v) == 0).all()) for v in vals]
    out = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in vals])
    return {"max_abs": float(np.abs(out).max()), "flushed": all(each), "each": each}


def probe_denormals(frameworks) -> dict:
    """Computes, in each framework, products whose exact results are float32 denormals (FTZ: flushed to
    0) and a denormal input times 1e30, a normal 1e-10 unless the input is read as 0 (DAZ); `flushed` is
    True where all were 0 (`each`: per product)."""
    import numpy as np
    tiny, denormal, big = np.float32(1e-20), np.float32(1e-40), np.float32(1e30)
    a = np.full((8, 8), tiny, np.float32)
    out = {"main_thread_ftz_daz": environment.flush_state()}
    for fw in frameworks:
        try:
            if fw == "numpy":
                vals = [a * a, a @ a, np.full(8, denormal, np.float32) * big]
            elif fw == "torch":
                import torch
                t = torch.from_numpy(a.copy())
                threads = torch.get_num_threads()
                torch.set_num_threads(max(2, threads))     # the worker threads too (inherited MXCSR)
                try:
                    many = torch.full((512, 512), 1e-21)
                    vals = [t * t, t @ t, torch.full((8,), 1e-40) * 1e30, many * many, many @ many]
                finally:
                    torch.set_num_threads(threads)
                vals = [v.numpy() for v in vals]
            elif fw == "tensorflow":
                import tensorflow as tf

                @tf.function
                def products(x, d):
                    return x * x, tf.matmul(x, x), d * 1e30
                vals = [v.numpy() for v in products(tf.constant(a), tf.constant(np.full(8, denormal, np.float32)))]
            elif fw == "dynet":
                import dynet as dy
                dy.renew_cg()
                x = dy.inputTensor(a.ravel())          # 1-D: a 2-D inputTensor corrupts DyNet 2.2's heap
                m = dy.reshape(x, (8, 8))
                vals = [dy.cmult(x, x).npvalue(), (m * m).npvalue(),
                        (dy.inputTensor(np.full(8, denormal, np.float32)) * 1e30).npvalue()]
                dy.renew_cg()
            else:
                continue
            out[fw] = _probe_values(np, vals)
        except Exception as exc:      # a probe that cannot run says why; the test fails on it
            out[fw] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return out


def frameworks_of(system_name: str) -> list[str]:
    """The numeric libraries a system computes with (numpy always: every system touches it)."""
    from .registry import SYSTEM_FACTS
    framework = SYSTEM_FACTS.get(system_name, (None,))[0]
    found = ["numpy"]
    if framework:
        found.append(framework)
    elif "torch" in sys.modules:                   # the Cavs engine's CPU GEMMs go through PyTorch's MKL
        found.append("torch")
    return found


# ---------------------------------------------------------------- memory

def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports KiB), start-up and warm-up included."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_peak_mb() -> float | None:
    """Peak device memory held by the process's allocators (PyTorch's caching allocator, CuPy's pool,
    which keeps freed blocks: its size at the end is its peak); the CUDA context is not included."""
    peaks = []
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            peaks.append(torch.cuda.max_memory_reserved() / 2**20)
    except Exception:
        pass
    cupy = sys.modules.get("cupy")
    try:
        if cupy is not None:
            peaks.append(cupy.get_default_memory_pool().total_bytes() / 2**20)
    except Exception:
        pass
    return max(peaks) if peaks else None


# ---------------------------------------------------------------- the cell

def _batches(spec):
    from cavs.models.datasets import load_samples, shuffled
    bs = spec["batch_size"]
    samples = load_samples(spec["workload"], "train", leaves=spec["leaves"])
    if spec.get("order", "shuffled") == "shuffled":     # docs/workloads.md; experiments.bench uses file order
        samples = shuffled(samples, seed=0)
    return [samples[i:i + bs] for i in range(0, len(samples) - bs + 1, bs)]   # last partial batch dropped


def build(spec: dict):
    """The cell's system, constructed as every cell constructs it (float32, seed 0)."""
    return system_factory(spec["system"])(
        spec["workload"], hidden=spec["hidden"], batch_size=spec["batch_size"], mode=spec["mode"],
        dtype="float32", threads=spec["threads"], seed=0, leaves=spec["leaves"], device=spec["device"],
        **spec["options"])


def measure(spec: dict, extra: dict) -> dict:
    ftz = environment.ftz_requested(spec.get("ftz"))
    bs = spec["batch_size"]
    batches = _batches(spec)
    epoch_samples = len(batches) * bs
    count = len(batches) if spec["samples"] is None else min(len(batches), math.ceil(spec["samples"] / bs))
    work = [sum(sample_work(spec["workload"], s) for s in b) for b in batches]
    # file order (experiments.bench, experiments.policies) means "the first `samples` of the file, warmed
    # up on the last batch": those keep the former choice unless the spec says otherwise
    file_order = spec.get("order", "shuffled") == "file"
    slice_how = spec.get("slice") or ("first" if file_order else "spread")
    timed = pick_slice(work, count, slice_how)
    how = spec.get("warmup") or ("last" if file_order else "largest")
    # small batches: a few more warm-up steps (at least 3 and 16 samples, where the profile asks for
    # any): a framework's first steps after the first run slower (TensorFlow at bs = 1: the 2nd step +35%)
    warm_count = spec["warmup_batches"]
    if how == "largest" and warm_count:
        warm_count = max(warm_count, min(3, math.ceil(16 / bs)))
    warmup = pick_warmup(work, timed, warm_count, how)

    system = build(spec)
    environment.set_flush_denormals(ftz)                # the harness's setting, whatever the system set
    backend = _backend(system, spec["system"])          # before timings.reset() clears timings.extra
    for i in warmup:
        system.step(system.prepare(batches[i]))
    system.synchronize()
    environment.set_flush_denormals(ftz)

    # the fastest pass: other load on a shared machine only slows one down. At least `repeats` passes, and
    # more until they have taken `min_timed_s` (as timeit's autorange does): the 2-core VMs run at about
    # 60% speed in spells of 0.1-0.5 s every few seconds, which a handful of 40 ms passes can all fall in
    best, started, passes = None, time.perf_counter(), 0
    while passes < spec["repeats"] or time.perf_counter() - started < spec.get("min_timed_s", 0.0):
        passes += 1
        system.timings.reset()
        counters = environment.cpu_counters()
        t0 = time.perf_counter()
        for i in timed:
            loss = system.step(system.prepare(batches[i]))
        system.synchronize()
        total = time.perf_counter() - t0
        if best is None or total < best[0]:
            steal = environment.steal_share(counters, environment.cpu_counters())
            best = (total, dataclasses.replace(system.timings), loss, steal)

    total, t, loss, steal = best
    memory_s = t.memory_s
    if t.memory_s is None and _wants_memory_profile(spec):
        from . import memprofile
        share = memprofile.profile(system, [batches[i] for i in timed])
        extra["memory_profile"] = share
        if share.get("memory_per_compute") is not None:
            memory_s = share["memory_per_compute"] * t.compute_s
    measured = len(timed) * bs
    result = {"backend": backend, "blas": str(getattr(system, "blas", "?")), "samples": measured,
              "epoch_samples": epoch_samples,
              "construct_s": t.construct_s, "compute_s": t.compute_s, "memory_s": memory_s,
              "total_s": total, "epoch_s": total / measured * epoch_samples,
              "extrapolated": measured < epoch_samples, "loss": float(loss), "status": "ok",
              "ftz": ftz, "peak_rss_mb": round(peak_rss_mb(), 1), "cpu_steal": steal}
    if spec.get("device") == "cuda":
        gpu = gpu_peak_mb()
        result["gpu_peak_mb"] = None if gpu is None else round(gpu, 1)
    if spec.get("probe_denormals"):
        extra["denormals"] = probe_denormals(frameworks_of(spec["system"]))
    extra["slice"] = {"how": slice_how, "batches": len(timed), "warmup": warmup, "passes": passes,
                      "slice_work_per_sample": sum(work[i] for i in timed) / measured,
                      "epoch_work_per_sample": sum(work) / epoch_samples}
    return result


def prepare(specs: list[dict]) -> dict:
    """Builds each cell's system once, untimed, and steps nothing: a system that measures the machine
    at its first construction (the engine's GEMM choice, registry.MEASURED_ONCE) caches what it
    measured, and the cells then read it (runner._prepare)."""
    t0 = time.perf_counter()
    for spec in specs:
        build(spec)
    return {"status": "ok", "seconds": round(time.perf_counter() - t0, 3), "built": len(specs)}


def _wants_memory_profile(spec) -> bool:
    """DyNet's memory movement is sampled (experiments/memprofile.py) in table2's cells, or wherever
    $CAVS_DYNET_PERF=1; $CAVS_DYNET_PERF=0 turns it off."""
    if not str(spec.get("system", "")).startswith("dynet"):
        return False
    flag = os.environ.get("CAVS_DYNET_PERF")
    if flag is not None:
        return environment.ftz_requested(flag)      # the same 0/1 parsing
    return spec.get("memory_profile", spec.get("experiment") == "table2")


def failure_reason(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "failed: out of memory (MemoryError)"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"failed: {type(exc).__name__}: {message}"[:300]


def _columns(result: dict) -> dict:
    """Only the results CSV's columns go on the result line (the runner writes them as a row)."""
    from .results import COLUMNS
    return {k: v for k, v in result.items() if k in COLUMNS or k == "status"}


def main(argv):
    launch.die_with_parent()
    if argv[1] == "--prepare":             # python -m experiments.cell --prepare '[SPEC, ...]'
        environment.set_flush_denormals(environment.ftz_requested(None))
        try:
            result = prepare(json.loads(argv[2]))
        except Exception as exc:
            traceback.print_exc()
            result = {"status": failure_reason(exc)}
        launch.emit(result)
        return
    spec = json.loads(argv[1])
    ftz = environment.ftz_requested(spec.get("ftz"))
    environment.set_flush_denormals(ftz)            # first, before any framework starts a thread
    os.environ["CAVS_FTZ"] = "1" if ftz else "0"    # for the engine and any process the system starts
    extra = {}
    try:
        result = measure(spec, extra)
    except Exception as exc:      # any failure of the system is this cell's result, not a crash of the sweep
        traceback.print_exc()
        result = {"status": failure_reason(exc), "peak_rss_mb": round(peak_rss_mb(), 1)}
    extra["result"] = result
    launch.emit(_columns(result), extra)


if __name__ == "__main__":
    main(sys.argv)
