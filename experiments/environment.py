"""RESULTS/environment.json: the machine and library versions the numbers came from."""
from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

# label -> distribution names to try (the first one installed wins)
LIBRARIES = {
    "numpy": ("numpy",), "numba": ("numba",), "numexpr": ("numexpr",), "torch": ("torch",),
    "tensorflow": ("tensorflow-cpu", "tensorflow"), "dynet": ("dyNET38", "dyNET", "dynet"),
    "cupy": ("cupy-cuda12x", "cupy-cuda11x", "cupy"), "pandas": ("pandas",), "matplotlib": ("matplotlib",),
}
ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
            "CAVS_BACKEND", "CAVS_CPU_BLAS", "CUDA_VISIBLE_DEVICES")


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_revision() -> str:
    """Short commit id, `-dirty` when the tree has changes; `uncommitted` before the first commit."""
    root = Path(__file__).resolve().parent.parent
    rev = _run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"])
    if not rev:
        return "uncommitted"
    dirty = _run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
    return rev + ("-dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


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


def _cavs_cpu_blas() -> str:
    """Which BLAS the engine's CPU backend multiplies with (cavs/backend/numpy.py)."""
    from cavs.backend.numpy import NumpyBackend
    return NumpyBackend().blas


def collect(threads: int, profile: str) -> dict:
    gpu = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]) \
        if shutil.which("nvidia-smi") else ""
    return {
        "cpu_model": _cpu_model(), "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpu": gpu or None, "platform": platform.platform(), "python": sys.version.split()[0],
        "libraries": {name: _version(d) for name, d in LIBRARIES.items()},
        "blas": _blas(), "cavs_cpu_blas": _cavs_cpu_blas(), "environment": {v: os.environ.get(v) for v in ENV_VARS},
        "cell_threads": threads, "profile": profile, "git_rev": git_revision(),
    }


def write(results_dir, threads: int, profile: str) -> Path:
    path = Path(results_dir) / "environment.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(collect(threads, profile), indent=2) + "\n")
    os.replace(tmp, path)
    return path
