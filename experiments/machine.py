"""Machine kinds: the facts that decide whether two machines' timings may share one results directory.

A kind is the CPU (its model string, and the generation: vendor, family and model numbers from
/proc/cpuinfo and the widest vector ISA it has), the core count, the memory (GiB, rounded) and the GPU
model(s). The model string alone does not tell generations apart: these VMs report "AMD EPYC" for a
2-core slice of an AVX2 EPYC (single-thread GEMMs at ~45 GFLOP/s) and of an AVX-512 one (130-240), whose
timings and even cross-library ratios differ by 2x. Timings hold only for the kind of machine they came
from, so a results directory holds one kind: its `environment.json` (and each CSV row's `machine`
column) records it, a sweep refuses to add rows of another kind, and with no directory named, a machine
of another kind measures into `results/<slug of its kind>/` of its own. A directory recorded before the
generation was part of the kind is of an unknown generation: it matches no machine that knows its own.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from cavs.backend.cpu import cpu_generation, cpu_model     # one reader of /proc/cpuinfo

KIND_KEYS = ("cpu_model", "cpu_vendor", "cpu_family", "cpu_model_number", "cpu_isa", "cpu_count", "memory_gib",
             "gpu")
# the CPU generation: a kind recorded without these is of an unknown generation (see differences)
GENERATION_KEYS = ("cpu_vendor", "cpu_family", "cpu_model_number", "cpu_isa")
ROOT = "results"                  # one directory per kind below it, and its index (README.md)

def _memory_gib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError, AttributeError):
        return None


def _gpu_from_names(names: list[str]) -> str | None:
    """'NVIDIA H200' for one GPU, '4 x NVIDIA H200' for four; None for none."""
    names = [n.strip() for n in names if n.strip()]
    if not names:
        return None
    kinds = sorted(set(names))
    return ", ".join(f"{names.count(k)} x {k}" if names.count(k) > 1 else k for k in kinds)


def _gpu() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return _gpu_from_names(out.splitlines())


def kind(cpuinfo: str | None = None) -> dict:
    """This machine's kind (`cpuinfo`: the text of a /proc/cpuinfo to read instead of this one's)."""
    return {"cpu_model": cpu_model(cpuinfo), **cpu_generation(cpuinfo), "cpu_count": os.cpu_count(),
            "memory_gib": _memory_gib(), "gpu": _gpu()}


def gpu_present() -> bool:
    """Whether the engine's GPU backend can run here (CuPy and a CUDA device)."""
    try:
        from cavs.backend import gpu_available
    except ImportError:
        return False
    return bool(gpu_available())


def node() -> str:
    """The name a row records for the machine it ran on."""
    return socket.gethostname()


def _generation(k: dict) -> str | None:
    """'AuthenticAMD family 26 model 2, avx512f', or None for a kind recorded without it."""
    if not any(k.get(key) for key in GENERATION_KEYS):
        return None
    return (f"{k.get('cpu_vendor') or '?'} family {k.get('cpu_family') or '?'} model "
            f"{k.get('cpu_model_number') or '?'}, {k.get('cpu_isa') or '?'}")


def label(k: dict) -> str:
    """'AMD EPYC (AuthenticAMD family 26 model 2, avx512f), 2 CPUs, 24 GiB, no GPU': a kind as one line
    (the CSV's `machine` column); a kind recorded before the generation was known has no parentheses."""
    mem = f"{k['memory_gib']} GiB" if k.get("memory_gib") is not None else "? GiB"
    gen = _generation(k)
    cpu = f"{k.get('cpu_model')} ({gen})" if gen else f"{k.get('cpu_model')}"
    return f"{cpu}, {k.get('cpu_count')} CPUs, {mem}, {k.get('gpu') or 'no GPU'}"


def slug(k: dict) -> str:
    """A directory name for a kind: 'amd-epyc-f26m2-avx512f-2cpu-24gib', '...-nvidia-h200'; a kind
    recorded without its generation: 'amd-epyc-2cpu-24gib'."""
    model = re.sub(r"\((r|tm)\)|\bcpu\b|\bprocessor\b|@.*$", " ", str(k.get("cpu_model")).lower())
    gen = ""
    if _generation(k):
        gen = f"f{k.get('cpu_family') or 'x'}m{k.get('cpu_model_number') or 'x'} {k.get('cpu_isa') or ''}"
        vendor = re.sub(r"^(genuine|authentic)", "", str(k.get("cpu_vendor") or "").lower())
        if vendor and vendor not in model:
            gen = f"{vendor} {gen}"
    parts = [model, gen, f"{k.get('cpu_count')}cpu", f"{k.get('memory_gib')}gib" if k.get("memory_gib") else "",
             k.get("gpu") or ""]
    text = re.sub(r"[^a-z0-9]+", "-", " ".join(parts).lower()).strip("-")
    return text or "this-machine"


def kind_of_environment(env: dict) -> dict:
    """The kind an environment.json records: its `machine_kind`, else what older files have
    (cpu_model, cpu_count, and the gpu column of nvidia-smi's name,memory,driver lines)."""
    if isinstance(env.get("machine_kind"), dict):
        return env["machine_kind"]
    gpu = env.get("gpu")
    if gpu:
        gpu = _gpu_from_names([line.split(",")[0] for line in str(gpu).splitlines()])
    return {"cpu_model": env.get("cpu_model"), "cpu_count": env.get("cpu_count"), "gpu": gpu}


def differences(recorded: dict, ours: dict) -> list[str]:
    """The kind's facts that differ: of those both record, and the generation wherever one side
    lacks it (an unknown generation is not ours, whatever the model string says)."""
    out = [k for k in KIND_KEYS if k not in GENERATION_KEYS and k in recorded and k in ours
           and recorded[k] != ours[k]]
    return out + [k for k in GENERATION_KEYS if recorded.get(k) != ours.get(k)]


def recorded_kind(results_dir) -> dict | None:
    path = Path(results_dir) / "environment.json"
    if not path.exists():
        return None
    try:
        return kind_of_environment(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def recorded_labels(results_dir) -> set[str]:
    """The `machine` labels the directory's CSV rows carry (rows older than the column carry none)."""
    from . import results
    labels = set()
    for path in Path(results_dir).glob("*.csv"):
        labels |= {r.get("machine") for r in results.read_rows(path) if r.get("machine")}
    return labels


def mismatch(results_dir, ours: dict) -> str | None:
    """Why `results_dir` may not take rows measured on kind `ours`, or None."""
    if os.environ.get("CAVS_ALLOW_OTHER_MACHINE"):
        return None
    recorded = recorded_kind(results_dir)
    if recorded and differences(recorded, ours):
        return label(recorded)
    others = recorded_labels(results_dir) - {label(ours)}
    return "; ".join(sorted(others)) or None


def check_results_dir(results_dir, ours: dict, where: str = "this one") -> None:
    """Stops the sweep when `results_dir` holds another kind's results (resuming would mix them)."""
    theirs = mismatch(results_dir, ours)
    if theirs:
        sys.exit(f"{results_dir} holds results measured on another machine ({theirs}; {where}: {label(ours)}). "
                 f"Measure into a directory of your own, e.g. `make fig8 RESULTS={ROOT}/{slug(ours)}` "
                 f"(what `make fig8` with no RESULTS= does).")


def default_results_dir(ours: dict, root=ROOT) -> tuple[Path, str]:
    """Where a sweep with no directory named measures: `root/<slug>` of this kind, always (the root
    holds only its index, results/README.md). Returns (directory, why)."""
    own = Path(root) / slug(ours)
    state = "holds this kind's results" if own.exists() else "is new: this kind has no results yet"
    return own, f"{own} {state} ({label(ours)})"


def check_nodes(kinds: dict[str, dict]) -> dict:
    """All nodes that run cells must be of one kind: returns it, or stops naming the nodes of each kind."""
    by_label: dict[str, list[str]] = {}
    for name, k in sorted(kinds.items()):
        by_label.setdefault(label(k), []).append(name)
    if len(by_label) > 1:
        listing = "; ".join(f"{', '.join(nodes)}: {lab}" for lab, nodes in by_label.items())
        sys.exit(f"the cluster's nodes are of {len(by_label)} machine kinds ({listing}); one CSV holds one "
                 f"kind: run the sweep on nodes of one kind (e.g. a Ray cluster per kind, each into its own "
                 f"RESULTS= directory)")
    return next(iter(kinds.values()))
