"""RESULTS/environment.json: the machine and library versions the numbers came from."""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from . import machine

# label -> distribution names to try (the first one installed wins)
LIBRARIES = {
    "numpy": ("numpy",), "numba": ("numba",), "numexpr": ("numexpr",), "torch": ("torch",),
    "tensorflow": ("tensorflow-cpu", "tensorflow"), "dynet": ("dyNET38", "dyNET", "dynet"),
    "cupy": ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy"), "pandas": ("pandas",), "matplotlib": ("matplotlib",),
    "onednn": ("onednn-cpu-gomp",),
}
ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
            "CAVS_BACKEND", "CAVS_CPU_BLAS", "CUDA_VISIBLE_DEVICES", "CAVS_FTZ", "CAVS_DYNET_MEM",
            "CAVS_DYNET_PERF")


# ---------------------------------------------------------------- the numeric environment (FTZ / DAZ)
#
# Flush-to-zero (a denormal result becomes 0) and denormals-are-zero (a denormal input is read as 0)
# are bits of each thread's floating-point control register: MXCSR bits 15 and 6 on x86-64, FPCR bit 24
# (FZ, both at once) on AArch64. Linux copies the register into every thread a thread creates, so the
# harness sets it in a cell's main thread before anything is imported, and every pool a framework
# starts later inherits it. It is set through glibc's fegetenv/fesetenv (ctypes, no framework needed):
# fenv_t holds MXCSR at byte 28 on x86-64 and FPCR at byte 0 on AArch64.
_FENV_LAYOUT = {"x86_64": (28, (1 << 15) | (1 << 6)), "amd64": (28, (1 << 15) | (1 << 6)),
                "aarch64": (0, 1 << 24), "arm64": (0, 1 << 24)}


def ftz_requested(value=None) -> bool:
    """The harness's setting: on unless `value` (or, when None, $CAVS_FTZ) is 0/false/off/no."""
    if value is None:
        value = os.environ.get("CAVS_FTZ", "1")
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() not in ("0", "false", "off", "no", "")


def _fenv():
    layout = _FENV_LAYOUT.get(platform.machine().lower())
    if layout is None:
        return None
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    except OSError:
        return None
    return libm, layout


def control_register() -> int | None:
    """This thread's MXCSR (x86-64) or FPCR (AArch64); None where it cannot be read."""
    env = _fenv()
    if env is None:
        return None
    (libm, (offset, _)), buf = env, (ctypes.c_uint8 * 64)()
    if libm.fegetenv(buf) != 0:
        return None
    return int.from_bytes(bytes(buf)[offset:offset + 4], "little")


def set_flush_denormals(on: bool) -> bool:
    """Sets (or clears) FTZ and DAZ on the calling thread; threads it creates afterwards inherit them.
    Returns whether the register now says what was asked (False where it cannot be set)."""
    env = _fenv()
    if env is None:
        return False
    libm, (offset, bits) = env
    buf = (ctypes.c_uint8 * 64)()
    if libm.fegetenv(buf) != 0:
        return False
    reg = int.from_bytes(bytes(buf)[offset:offset + 4], "little")
    reg = (reg | bits) if on else (reg & ~bits)
    buf[offset:offset + 4] = list(reg.to_bytes(4, "little"))
    if libm.fesetenv(buf) != 0:
        return False
    now = control_register()
    return now is not None and ((now & bits) == bits) == on


def flush_state() -> bool | None:
    """Whether FTZ and DAZ are both on in this thread; None where unknown."""
    reg, env = control_register(), _fenv()
    if reg is None or env is None:
        return None
    bits = env[1][1]
    return (reg & bits) == bits


def cpu_counters(stat: str | None = None) -> tuple[int, int] | None:
    """(steal, busy + steal) in clock ticks over all CPUs, from /proc/stat's first line (`stat`:
    that file's text); None where there is no such file. Busy is user, nice, system, irq and
    softirq: the time the VM's CPUs ran or wanted to run, idle and iowait left out."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return None
    fields = stat.split("\n", 1)[0].split()
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    return steal, user + nice + system + irq + softirq + steal


def steal_share(before, after) -> float | None:
    """The share of the CPU time wanted between two cpu_counters() readings that the host gave to
    other guests (vmstat's `st`, counted over the busy time only: an idle second core steals
    nothing). On the 2-core VMs it reached 20-44% in spells of hours, and every time with it."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_revision(root: Path | None = None) -> str:
    """Short commit id, `-dirty` when the code has uncommitted changes; `uncommitted` before the
    first commit. Changes under results/ do not count: a script that measures several things writes
    a tracked CSV before its next measurement starts, and that is not a change of the code."""
    root = root or Path(__file__).resolve().parent.parent
    rev = _run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"])
    if not rev:
        return "uncommitted"
    dirty = _run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".",
                  ":(exclude)results"])
    return rev + ("-dirty" if dirty else "")


def _version(dists) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _blas() -> list[dict]:
    import numpy  # noqa: F401  (threadpoolctl only sees libraries already loaded)
    from threadpoolctl import threadpool_info
    return [{k: info.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
            for info in threadpool_info()]


def cpu_blas() -> dict:
    """The CPU's GEMM libraries as benchmark cells see them (launch.env unsets OPENBLAS_CORETYPE and
    OPENBLAS_L2_SIZE there, for every system alike) and how the engine chooses among them."""
    from cavs import blas
    from . import launch
    probe = ("from threadpoolctl import threadpool_info; import numpy; "
             "print(next((i.get('architecture') for i in threadpool_info() if i.get('internal_api') == 'openblas'), ''))")
    try:
        in_cells = subprocess.run([sys.executable, "-c", probe], env=launch.env(1), capture_output=True, text=True,
                                  timeout=60).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        in_cells = None
    return {"libraries": blas.available("float32"), "openblas_kernels_in_cells": in_cells,
            "openblas_kernels_here": blas.openblas_kernels(), "unset_in_cells": list(launch.NATIVE_BLAS_UNSET),
            "engine": os.environ.get("CAVS_CPU_BLAS") or "auto: the fastest library per product shape, measured "
                                                          "once per machine and cached (cavs/blas.py)"}


def collect(threads: int, profile: str) -> dict:
    gpu = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]) \
        if shutil.which("nvidia-smi") else ""
    return {
        "cpu_model": machine.cpu_model(), "cpu_count": os.cpu_count(), "machine_kind": machine.kind(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpu": gpu or None, "platform": platform.platform(), "python": sys.version.split()[0],
        "libraries": {name: _version(d) for name, d in LIBRARIES.items()},
        "blas": _blas(), "cpu_blas": cpu_blas(), "environment": {v: os.environ.get(v) for v in ENV_VARS},
        "cell_threads": threads, "profile": profile, "git_rev": git_revision(),
        "numeric": numeric_record(), "dynet_memory_profiler": perf_status(),
    }


def numeric_record() -> dict:
    """What every cell of this sweep computes under (set by experiments/cell.py for every system)."""
    on = ftz_requested()
    return {"ftz": on, "daz": on, "set_by": "the harness, in each cell's main thread before any import "
            "(glibc fesetenv: MXCSR FTZ+DAZ on x86-64, FPCR FZ on AArch64), again after the system is "
            "built and warmed up; threads started later inherit it",
            "exceptions": "TensorFlow flushes denormals inside its own kernels whatever the setting "
                          "(tensorflow/core/platform/denormal.h, ScopedFlushDenormal)" if not on else None,
            "machine": platform.machine()}


def perf_status() -> str:
    """Whether DyNet's memory movement can be sampled here (experiments/cell.py, table2's DyNet cells)."""
    perf = shutil.which("perf")
    if not perf:
        return "unavailable: no `perf` on PATH (apt-get install linux-perf)"
    try:
        paranoid = Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
    except OSError:
        paranoid = "?"
    version = _run([perf, "--version"]) or "perf (version unknown)"
    import tempfile
    with tempfile.TemporaryDirectory(prefix="cavs-perf-check-") as tmp:
        try:      # what the cells do: sample a process of this user, with call chains
            probe = subprocess.run([perf, "record", "-q", "-e", "cpu-clock", "-g", "-o", f"{tmp}/p.data", "--",
                                    sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"unavailable: {version} did not run: {exc}"
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[0]
        return f"unavailable: {version} cannot sample here (perf_event_paranoid={paranoid}): {why}"[:300]
    return f"{version}, perf_event_paranoid={paranoid}"


def write(results_dir, threads: int, profile: str) -> Path:
    path = Path(results_dir) / "environment.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(collect(threads, profile), indent=2) + "\n")
    os.replace(tmp, path)
    return path
