"""Machine kinds: the facts that decide whether two machines' timings may share one results directory.

A kind is CPU model, core count, memory (GiB, rounded) and GPU model(s). Timings hold only for the kind
of machine they came from, so a results directory holds one kind: its `environment.json` (and each CSV
row's `machine` column) records it, a sweep refuses to add rows of another kind, and with no directory
named, a machine of another kind measures into `results/<slug of its kind>/` of its own.
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

KIND_KEYS = ("cpu_model", "cpu_count", "memory_gib", "gpu")
ROOT = "results"                  # the committed reference machine's directory


def _cpu_model() -> str:
    from .environment import _cpu_model as model      # one reader of /proc/cpuinfo
    return model()


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


def kind() -> dict:
    """This machine's kind."""
    return {"cpu_model": _cpu_model(), "cpu_count": os.cpu_count(), "memory_gib": _memory_gib(), "gpu": _gpu()}


def node() -> str:
    """The name a row records for the machine it ran on."""
    return socket.gethostname()


def label(k: dict) -> str:
    """'AMD EPYC, 2 CPUs, 23 GiB, no GPU': a kind as one line (the CSV's `machine` column)."""
    mem = f"{k['memory_gib']} GiB" if k.get("memory_gib") is not None else "? GiB"
    return f"{k.get('cpu_model')}, {k.get('cpu_count')} CPUs, {mem}, {k.get('gpu') or 'no GPU'}"


def slug(k: dict) -> str:
    """A directory name for a kind: 'amd-epyc-2cpu-23gib', '...-nvidia-h200'."""
    model = re.sub(r"\((r|tm)\)|\bcpu\b|\bprocessor\b|@.*$", " ", str(k.get("cpu_model")).lower())
    parts = [model, f"{k.get('cpu_count')}cpu", f"{k.get('memory_gib')}gib" if k.get("memory_gib") else "",
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
    """The kind's facts that differ, of those both record."""
    return [k for k in KIND_KEYS if k in recorded and k in ours and recorded[k] != ours[k]]


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
        return label({k: recorded.get(k, "?") for k in KIND_KEYS})
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
    """Where a sweep with no directory named measures: `root` when it is empty or holds this kind's
    results, else `root/<slug>` of this kind. Returns (directory, why)."""
    root = Path(root)
    theirs = mismatch(root, ours)
    if theirs is None:
        return root, f"{root} holds this kind's results ({label(ours)}) or none"
    own = root / slug(ours)
    return own, (f"{root} holds another machine's results ({theirs}); this machine ({label(ours)}) "
                 f"measures into {own} of its own")


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
